// Command mockcsi serves Kubernetes' e2e CSI mock driver on a Unix socket, with
// a small fault-injection layer for attacher tests and benchmarks.
//
// The mock is single-node: its node ID is the driver name. It pre-creates
// volumes on request and prints one "<name> <volume id>" line per volume, then
// a line "ready" once the socket is listening.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

func main() {
	endpoint := flag.String("endpoint", "/tmp/mockcsi.sock", "Unix socket path (a unix:// prefix is accepted)")
	name := flag.String("name", service.Name, "driver name, which is also the only node ID the mock accepts")
	attachLimit := flag.Int64("attach-limit", 0, "maximum number of attached volumes (0: unlimited)")
	volumes := flag.Int("volumes", 0, "pre-create this many volumes named vol-<i>")
	disableAttach := flag.Bool("disable-attach", false, "do not advertise PUBLISH_UNPUBLISH_VOLUME")
	delay := flag.Duration("publish-delay", 0, "sleep this long before every Controller(Un)PublishVolume")
	failEvery := flag.Int64("fail-every", 0, "fail every Nth Controller(Un)PublishVolume (0: never)")
	failCode := flag.String("fail-code", "Unavailable", "gRPC code name of injected failures")
	failMethod := flag.String("fail-method", "", "only inject failures into this method (ControllerPublishVolume or ControllerUnpublishVolume; empty: both)")
	klog.InitFlags(nil)
	flag.Parse()

	code, ok := codeByName(*failCode)
	if !ok {
		fmt.Fprintf(os.Stderr, "mockcsi: unknown gRPC code %q\n", *failCode)
		os.Exit(2)
	}

	svc := service.New(service.Config{DriverName: *name, AttachLimit: *attachLimit, DisableAttach: *disableAttach})
	caps := []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}}
	for i := 0; i < *volumes; i++ {
		n := fmt.Sprintf("vol-%d", i)
		r, err := svc.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: n, VolumeCapabilities: caps})
		if err != nil {
			klog.Fatalf("pre-create %s: %v", n, err)
		}
		fmt.Println(n, r.GetVolume().GetVolumeId())
	}

	var calls atomic.Int64
	inject := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		m := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		klog.V(2).InfoS("call", "method", m)
		if m == "ControllerPublishVolume" || m == "ControllerUnpublishVolume" {
			if *delay > 0 {
				time.Sleep(*delay)
			}
			if *failEvery > 0 && (*failMethod == "" || *failMethod == m) && calls.Add(1)%*failEvery == 0 {
				return nil, status.Error(code, "injected failure")
			}
		}
		resp, err := h(ctx, req)
		klog.V(2).InfoS("result", "method", m, "err", err)
		return resp, err
	}

	path := strings.TrimPrefix(*endpoint, "unix://")
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		klog.Fatal(err)
	}
	d := driver.NewCSIDriver(&driver.CSIDriverServers{Controller: svc, Identity: svc, Node: svc})
	if err := d.Start(l, inject); err != nil {
		klog.Fatal(err)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	d.Stop()
}

func codeByName(name string) (codes.Code, bool) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c, true
		}
	}
	return 0, false
}
