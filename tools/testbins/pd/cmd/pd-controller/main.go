// Command pd-controller serves the GCE Persistent Disk CSI driver's own
// controller service (sigs.k8s.io/gcp-compute-persistent-disk-csi-driver,
// package pkg/gce-pd-csi-driver, the version pinned in ../../go.mod) on a Unix
// socket, against the driver's fake cloud (pkg/gce-cloud-provider/compute,
// FakeCloudProvider), wired as the driver's own test/sanity does. It has no
// node service: attacher tests need the identity and controller services only.
//
// What this program adds around the vendor's code, and nothing else:
//
//   - a lock around the fake cloud (the fake is not safe for concurrent use,
//     and attachers publish concurrently), and copies of the instances it hands
//     out, so that a publish reading an instance never races an attach writing it;
//   - optional latency with jitter on every AttachDisk and DetachDisk (a real
//     cloud takes seconds), so ControllerPublish/Unpublish calls that change an
//     attachment take that long and the ones that find it done return at once;
//   - GCE's refusal to attach a disk that another instance uses read-write (or
//     to attach read-write a disk that another instance uses), which the fake
//     does not model; the driver's own code recognises GCE's wording of it
//     (pkg/common: isUserMultiAttachError) and answers InvalidArgument;
//   - the users of each disk in disks.list (the fake leaves them empty), so the
//     driver's ListVolumes reports the published nodes, as on GCE;
//   - instances that can be deleted (the fake can only insert them);
//   - an HTTP endpoint on loopback for tests: the attachments per instance, the
//     disks, the Controller(Un)Publish calls received, and out-of-band changes
//     (create or delete a disk or an instance, attach or detach a disk).
//
// Node IDs are projects/<project>/zones/<zone>/instances/<instance>; volume IDs
// projects/<project>/zones/<zone>/disks/<disk>. The program prints
// "http <address>" and then "ready" on stdout once both servers listen.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/GoogleCloudPlatform/k8s-cloud-provider/pkg/cloud/meta"
	"github.com/container-storage-interface/spec/lib/go/csi"
	computev1 "google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	gce "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver/pkg/gce-cloud-provider/compute"
	driver "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver/pkg/gce-pd-csi-driver"
	"sigs.k8s.io/gcp-compute-persistent-disk-csi-driver/pkg/parameters"
)

// driverModule is the module whose version GetPluginInfo reports.
const driverModule = "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver"

// computeBase is the URL prefix of GCE resource links (the fake's BasePath).
const computeBase = gce.BasePath

func main() {
	endpoint := flag.String("endpoint", "/tmp/pd-controller.sock", "Unix socket path of the CSI server (a unix:// prefix is accepted)")
	name := flag.String("name", "pd.csi.storage.gke.io", "driver name reported by GetPluginInfo")
	project := flag.String("project", "test-project", "the fake cloud's project")
	zone := flag.String("zone", "country-region-zone", "the fake cloud's zone, of every instance and (by default) every disk")
	instances := flag.String("instances", "", "comma-separated instance names to create at start")
	disks := flag.String("disks", "", "comma-separated disk names to create at start (pd-balanced, 10 GiB, in --zone)")
	latency := flag.Duration("latency", 0, "time each AttachDisk and DetachDisk of the fake cloud takes")
	jitter := flag.Float64("jitter", 0.2, "relative jitter of --latency: each operation takes latency * (1 ± jitter), uniformly")
	httpAddr := flag.String("http", "127.0.0.1:0", "address of the test endpoint (loopback)")
	backoffInitial := flag.Duration("backoff-initial", 0, "the driver's per node+volume error backoff, initial duration (the driver's own default is 200ms; 0 disables it, so that an answer never depends on when the attacher retries)")
	backoffMax := flag.Duration("backoff-max", 5*time.Minute, "the driver's error backoff, maximum duration")
	klog.InitFlags(nil)
	flag.Parse()

	if *jitter < 0 || *jitter > 1 {
		fmt.Fprintf(os.Stderr, "pd-controller: --jitter must be within [0, 1], got %v\n", *jitter)
		os.Exit(2)
	}

	fake, err := gce.CreateFakeCloudProvider(*project, *zone, nil)
	if err != nil {
		klog.Fatalf("creating the fake cloud: %v", err)
	}
	c := &cloud{
		FakeCloudProvider: fake,
		project:           *project,
		zone:              *zone,
		latency:           *latency,
		jitter:            *jitter,
		rng:               rand.New(rand.NewSource(time.Now().UnixNano())),
		deleted:           map[string]bool{},
		known:             map[string]bool{},
	}
	for _, n := range splitList(*instances) {
		c.insertInstance(n)
	}
	for _, n := range splitList(*disks) {
		if err := c.createDisk(n, *zone); err != nil {
			klog.Fatalf("creating disk %s: %v", n, err)
		}
	}

	gceDriver := driver.GetGCEDriver()
	identity := driver.NewIdentityServer(gceDriver)
	// The arguments of the driver's own test/sanity, except the error backoff
	// (a flag here) and the data cache (off, as in the driver's default flags).
	controller := driver.NewControllerServer(gceDriver, c, *backoffInitial, *backoffMax,
		[]string{} /* fallbackRequisiteZones */, false /* enableStoragePools */, false, /* enableDataCache */
		driver.MultiZoneVolumeHandleConfig{}, driver.ListVolumesConfig{},
		driver.ProvisionableDisksConfig{
			SupportsIopsChange:       []string{"hyperdisk-balanced", "hyperdisk-extreme"},
			SupportsThroughputChange: []string{"hyperdisk-balanced", "hyperdisk-throughput", "hyperdisk-ml"},
		},
		true /* enableHdHA */, &driver.GCEControllerServerArgs{})
	if err := gceDriver.SetupGCEDriver(*name, driverVersion(), nil, nil, identity, controller, nil); err != nil {
		klog.Fatalf("setting up the driver: %v", err)
	}

	rec := &recorder{}
	socket := strings.TrimPrefix(*endpoint, "unix://")
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		klog.Fatalf("removing %s: %v", socket, err)
	}
	csiListener, err := net.Listen("unix", socket)
	if err != nil {
		klog.Fatalf("listening on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	csi.RegisterIdentityServer(server, identity)
	csi.RegisterControllerServer(server, &recordingController{ControllerServer: controller, rec: rec})

	httpListener, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		klog.Fatalf("listening on %s: %v", *httpAddr, err)
	}
	httpServer := &http.Server{Handler: testEndpoint(c, rec), ReadHeaderTimeout: 10 * time.Second}

	go func() {
		if err := server.Serve(csiListener); err != nil {
			klog.Fatalf("CSI server: %v", err)
		}
	}()
	go func() {
		if err := httpServer.Serve(httpListener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.Fatalf("HTTP server: %v", err)
		}
	}()
	fmt.Printf("http %s\n", httpListener.Addr())
	fmt.Println("ready")
	klog.Infof("driver %s %s serving %s; project %s, zone %s, latency %v ± %.0f%%",
		*name, driverVersion(), socket, *project, *zone, *latency, *jitter*100)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	server.Stop()
	_ = httpServer.Close()
	_ = os.Remove(socket)
}

// driverVersion is the version of the driver module this binary was built with.
func driverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == driverModule {
				return dep.Version
			}
		}
	}
	return "unknown"
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// === the fake cloud ===

// cloud is the driver's FakeCloudProvider behind one lock, with the additions
// listed in the package comment. Methods not overridden here are not used by
// the controller paths the tests exercise (snapshots, images, resizing).
type cloud struct {
	*gce.FakeCloudProvider

	project, zone string
	latency       time.Duration
	jitter        float64

	// mu serialises every access to the fake (its maps and instances).
	mu sync.Mutex
	// rng draws the jitter; guarded by mu.
	rng *rand.Rand
	// deleted names the instances deleted through the test endpoint (the fake
	// has no way to remove one); guarded by mu.
	deleted map[string]bool
	// known names every instance ever inserted, for listings; guarded by mu.
	known map[string]bool
}

func notFound() error {
	return &googleapi.Error{Errors: []googleapi.ErrorItem{{Reason: "notFound"}}}
}

func (c *cloud) instanceLink(name string) string {
	return fmt.Sprintf("%sprojects/%s/zones/%s/instances/%s", computeBase, c.project, c.zone, name)
}

func (c *cloud) insertInstance(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.deleted, name)
	if c.known[name] {
		return
	}
	c.known[name] = true
	c.FakeCloudProvider.InsertInstance(&computev1.Instance{
		Name:        name,
		Zone:        c.zone,
		SelfLink:    c.instanceLink(name),
		MachineType: fmt.Sprintf("zones/%s/machineTypes/n2-standard-4", c.zone),
		Disks:       []*computev1.AttachedDisk{},
	}, c.zone, name)
}

func (c *cloud) deleteInstance(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.known[name] || c.deleted[name] {
		return false
	}
	c.deleted[name] = true
	return true
}

// instance returns the fake's instance (not a copy); c.mu must be held.
func (c *cloud) instance(ctx context.Context, name string) (*computev1.Instance, error) {
	if c.deleted[name] {
		return nil, notFound()
	}
	return c.FakeCloudProvider.GetInstanceOrError(ctx, c.project, c.zone, name)
}

func (c *cloud) createDisk(name, zone string) error {
	ctx := context.Background()
	return c.InsertDisk(ctx, c.project, meta.ZonalKey(name, zone),
		parameters.DiskParameters{DiskType: "pd-balanced"}, 10<<30, &csi.CapacityRange{RequiredBytes: 10 << 30},
		nil, "", "", false, "")
}

// sleep waits for latency ± jitter (a cloud operation in progress).
func (c *cloud) sleep(ctx context.Context) {
	if c.latency <= 0 {
		return
	}
	c.mu.Lock()
	f := 1 + c.jitter*(2*c.rng.Float64()-1)
	c.mu.Unlock()
	t := time.NewTimer(time.Duration(float64(c.latency) * f))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (c *cloud) GetDisk(ctx context.Context, project string, key *meta.Key) (*gce.CloudDisk, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.GetDisk(ctx, project, key)
}

func (c *cloud) RepairUnderspecifiedVolumeKey(ctx context.Context, project string, key *meta.Key, fallbackZone string) (string, *meta.Key, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.RepairUnderspecifiedVolumeKey(ctx, project, key, fallbackZone)
}

func (c *cloud) InsertDisk(ctx context.Context, project string, key *meta.Key, params parameters.DiskParameters, capBytes int64, capacityRange *csi.CapacityRange, replicaZones []string, snapshotID string, volumeContentSourceVolumeID string, multiWriter bool, accessMode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.InsertDisk(ctx, project, key, params, capBytes, capacityRange, replicaZones, snapshotID, volumeContentSourceVolumeID, multiWriter, accessMode)
}

func (c *cloud) DeleteDisk(ctx context.Context, project string, key *meta.Key) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.DeleteDisk(ctx, project, key)
}

func (c *cloud) UpdateDisk(ctx context.Context, project string, key *meta.Key, existing *gce.CloudDisk, params parameters.ModifyVolumeParameters) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.UpdateDisk(ctx, project, key, existing, params)
}

func (c *cloud) SetDiskAccessMode(ctx context.Context, project string, key *meta.Key, accessMode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.SetDiskAccessMode(ctx, project, key, accessMode)
}

func (c *cloud) SetDiskLabels(ctx context.Context, project string, key *meta.Key, disk *gce.CloudDisk, labels map[string]string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.SetDiskLabels(ctx, project, key, disk, labels)
}

func (c *cloud) ResizeDisk(ctx context.Context, project string, key *meta.Key, requestBytes int64) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeCloudProvider.ResizeDisk(ctx, project, key, requestBytes)
}

// GetInstanceOrError returns a copy of the instance (its disk list copied), so
// that the caller can read it while other operations attach and detach.
func (c *cloud) GetInstanceOrError(ctx context.Context, project, zone, name string) (*computev1.Instance, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	inst, err := c.instance(ctx, name)
	if err != nil {
		return nil, err
	}
	cp := *inst
	cp.Disks = append([]*computev1.AttachedDisk(nil), inst.Disks...)
	return &cp, nil
}

// users lists, per disk source link, the instances that have it attached and
// in which mode; c.mu must be held.
func (c *cloud) users() map[string]map[string]string {
	out := map[string]map[string]string{}
	for name := range c.known {
		if c.deleted[name] {
			continue
		}
		inst, err := c.FakeCloudProvider.GetInstanceOrError(context.Background(), c.project, c.zone, name)
		if err != nil {
			continue
		}
		for _, d := range inst.Disks {
			if out[d.Source] == nil {
				out[d.Source] = map[string]string{}
			}
			out[d.Source][name] = d.Mode
		}
	}
	return out
}

// AttachDisk takes the configured latency, then attaches as the fake does,
// unless GCE would refuse: the disk is in read-write use by another instance,
// or read-write is asked while another instance uses it.
func (c *cloud) AttachDisk(ctx context.Context, project string, key *meta.Key, readWrite, diskType, instanceZone, instanceName string, forceAttach bool) error {
	c.sleep(ctx)
	return c.attach(ctx, project, key, readWrite, diskType, instanceZone, instanceName, forceAttach)
}

// attach is AttachDisk without the latency.
func (c *cloud) attach(ctx context.Context, project string, key *meta.Key, readWrite, diskType, instanceZone, instanceName string, forceAttach bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.instance(ctx, instanceName); err != nil {
		return fmt.Errorf("failed to get instance %v", instanceName)
	}
	source := c.FakeCloudProvider.GetDiskSourceURI(project, key)
	for other, mode := range c.users()[source] {
		if other == instanceName {
			continue
		}
		if mode == "READ_WRITE" || readWrite == "READ_WRITE" {
			resource := strings.TrimPrefix(source, computeBase)
			return &googleapi.Error{
				Code: http.StatusBadRequest,
				Message: fmt.Sprintf("The disk resource '%s' is already being used by '%s'",
					resource, strings.TrimPrefix(c.instanceLink(other), computeBase)),
				Errors: []googleapi.ErrorItem{{Reason: "resourceInUseByAnotherResource"}},
			}
		}
	}
	return c.FakeCloudProvider.AttachDisk(ctx, project, key, readWrite, diskType, instanceZone, instanceName, forceAttach)
}

// DetachDisk takes the configured latency, then detaches as the fake does (a
// disk no longer attached is left alone: the fake would index out of range).
func (c *cloud) DetachDisk(ctx context.Context, project, deviceName, instanceZone, instanceName string) error {
	c.sleep(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	inst, err := c.instance(ctx, instanceName)
	if err != nil {
		return fmt.Errorf("Failed to get instance %v", instanceName)
	}
	for _, d := range inst.Disks {
		if d.DeviceName == deviceName {
			return c.FakeCloudProvider.DetachDisk(ctx, project, deviceName, instanceZone, instanceName)
		}
	}
	return nil
}

// ListDisks lists the fake's disks with their users filled in, as GCE's
// disks.list reports them (the driver's ListVolumes reads them).
func (c *cloud) ListDisks(ctx context.Context, fields []googleapi.Field) ([]*computev1.Disk, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	disks, token, err := c.FakeCloudProvider.ListDisks(ctx, fields)
	if err != nil {
		return nil, token, err
	}
	users := c.users()
	out := make([]*computev1.Disk, 0, len(disks))
	for _, d := range disks {
		cp := *d
		cp.Users = nil
		source := c.FakeCloudProvider.GetDiskSourceURI(c.project, meta.ZonalKey(d.Name, zoneOf(d.Zone)))
		for name := range users[source] {
			cp.Users = append(cp.Users, c.instanceLink(name))
		}
		sort.Strings(cp.Users)
		out = append(out, &cp)
	}
	return out, token, nil
}

func (c *cloud) ListDisksWithFilter(ctx context.Context, fields []googleapi.Field, filter string) ([]*computev1.Disk, string, error) {
	return c.ListDisks(ctx, fields)
}

func (c *cloud) ListInstances(ctx context.Context, fields []googleapi.Field) ([]*computev1.Instance, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*computev1.Instance
	for name := range c.known {
		if inst, err := c.instance(ctx, name); err == nil {
			cp := *inst
			cp.Disks = append([]*computev1.AttachedDisk(nil), inst.Disks...)
			out = append(out, &cp)
		}
	}
	return out, "", nil
}

// zoneOf is the last path element of a zone link (or the name itself).
func zoneOf(zone string) string {
	return zone[strings.LastIndex(zone, "/")+1:]
}

// === recorded calls ===

// call is one ControllerPublishVolume or ControllerUnpublishVolume the driver answered.
type call struct {
	Method   string `json:"method"`
	VolumeID string `json:"volumeId"`
	NodeID   string `json:"nodeId"`
	Readonly bool   `json:"readonly"`
	// AccessMode is the CSI access mode name (publish only).
	AccessMode string `json:"accessMode,omitempty"`
	// Code is the gRPC code name of the answer ("OK" for success).
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
	// StartMs and EndMs are Unix milliseconds of arrival and answer.
	StartMs int64 `json:"startMs"`
	EndMs   int64 `json:"endMs"`
}

type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) add(c call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

func (r *recorder) list() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...)
}

// recordingController is the driver's controller service with its
// Controller(Un)PublishVolume calls recorded.
type recordingController struct {
	csi.ControllerServer
	rec *recorder
}

func (s *recordingController) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	start := time.Now()
	resp, err := s.ControllerServer.ControllerPublishVolume(ctx, req)
	st := status.Convert(err)
	s.rec.add(call{
		Method: "ControllerPublishVolume", VolumeID: req.GetVolumeId(), NodeID: req.GetNodeId(),
		Readonly: req.GetReadonly(), AccessMode: req.GetVolumeCapability().GetAccessMode().GetMode().String(),
		Code: st.Code().String(), Message: st.Message(), StartMs: start.UnixMilli(), EndMs: time.Now().UnixMilli(),
	})
	return resp, err
}

func (s *recordingController) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	start := time.Now()
	resp, err := s.ControllerServer.ControllerUnpublishVolume(ctx, req)
	st := status.Convert(err)
	s.rec.add(call{
		Method: "ControllerUnpublishVolume", VolumeID: req.GetVolumeId(), NodeID: req.GetNodeId(),
		Code: st.Code().String(), Message: st.Message(), StartMs: start.UnixMilli(), EndMs: time.Now().UnixMilli(),
	})
	return resp, err
}

// === the test endpoint ===

// attachment is one disk attached to an instance.
type attachment struct {
	Disk string `json:"disk"`
	Mode string `json:"mode"`
}

// testEndpoint serves, all in JSON:
//
//	GET    /attachments                 {"<instance>": [{"disk": "<name>", "mode": "READ_WRITE"}], ...} (every live instance)
//	GET    /disks                       ["<zone>/<name>", ...]
//	GET    /calls                       the Controller(Un)PublishVolume calls, in order of answer
//	POST   /disks?name=D[&zone=Z]       create a disk (out of band)
//	DELETE /disks?name=D[&zone=Z]       delete a disk (out of band; attachments stay, as on GCE)
//	POST   /instances?name=I            create (or re-create) an instance
//	DELETE /instances?name=I            delete an instance
//	POST   /attach?instance=I&disk=D[&mode=READ_ONLY]   attach out of band (GCE's refusals apply)
//	POST   /detach?instance=I&disk=D    detach out of band
func testEndpoint(c *cloud, rec *recorder) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	fail := func(w http.ResponseWriter, code int, err error) {
		http.Error(w, err.Error(), code)
	}
	ctx := context.Background()
	mux.HandleFunc("GET /attachments", func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		out := map[string][]attachment{}
		for name := range c.known {
			inst, err := c.instance(ctx, name)
			if err != nil {
				continue
			}
			list := []attachment{}
			for _, d := range inst.Disks {
				list = append(list, attachment{Disk: d.DeviceName, Mode: d.Mode})
			}
			sort.Slice(list, func(i, j int) bool { return list[i].Disk < list[j].Disk })
			out[name] = list
		}
		c.mu.Unlock()
		reply(w, out)
	})
	mux.HandleFunc("GET /disks", func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		disks, _, err := c.FakeCloudProvider.ListDisks(ctx, nil)
		if err != nil {
			c.mu.Unlock()
			fail(w, http.StatusInternalServerError, err)
			return
		}
		out := []string{}
		for _, d := range disks {
			out = append(out, zoneOf(d.Zone)+"/"+d.Name)
		}
		c.mu.Unlock()
		sort.Strings(out)
		reply(w, out)
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, r *http.Request) {
		reply(w, rec.list())
	})
	zoneArg := func(r *http.Request) string {
		if z := r.URL.Query().Get("zone"); z != "" {
			return z
		}
		return c.zone
	}
	mux.HandleFunc("POST /disks", func(w http.ResponseWriter, r *http.Request) {
		if err := c.createDisk(r.URL.Query().Get("name"), zoneArg(r)); err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		reply(w, "created")
	})
	mux.HandleFunc("DELETE /disks", func(w http.ResponseWriter, r *http.Request) {
		_ = c.DeleteDisk(ctx, c.project, meta.ZonalKey(r.URL.Query().Get("name"), zoneArg(r)))
		reply(w, "deleted")
	})
	mux.HandleFunc("POST /instances", func(w http.ResponseWriter, r *http.Request) {
		c.insertInstance(r.URL.Query().Get("name"))
		reply(w, "created")
	})
	mux.HandleFunc("DELETE /instances", func(w http.ResponseWriter, r *http.Request) {
		if !c.deleteInstance(r.URL.Query().Get("name")) {
			fail(w, http.StatusNotFound, notFound())
			return
		}
		reply(w, "deleted")
	})
	mux.HandleFunc("POST /attach", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		mode := q.Get("mode")
		if mode == "" {
			mode = "READ_WRITE"
		}
		key := meta.ZonalKey(q.Get("disk"), zoneArg(r))
		if _, err := c.GetDisk(ctx, c.project, key); err != nil {
			fail(w, http.StatusNotFound, err)
			return
		}
		// Out of band: no latency.
		if err := c.attach(ctx, c.project, key, mode, "PERSISTENT", c.zone, q.Get("instance"), false); err != nil {
			fail(w, http.StatusConflict, err)
			return
		}
		reply(w, "attached")
	})
	mux.HandleFunc("POST /detach", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		c.mu.Lock()
		inst, err := c.instance(ctx, q.Get("instance"))
		if err == nil {
			for _, d := range inst.Disks {
				if d.DeviceName == q.Get("disk") {
					err = c.FakeCloudProvider.DetachDisk(ctx, c.project, d.DeviceName, c.zone, inst.Name)
					break
				}
			}
		}
		c.mu.Unlock()
		if err != nil {
			fail(w, http.StatusNotFound, err)
			return
		}
		reply(w, "detached")
	})
	return mux
}
