// Command ebs-controller serves the AWS EBS CSI driver's own identity and
// controller services (github.com/kubernetes-sigs/aws-ebs-csi-driver, package
// pkg/driver, the version pinned in ../../go.mod, unmodified) on a Unix socket,
// as the driver's `controller` mode serves them in a cluster, but against an
// in-memory EC2 of ours instead of AWS. It has no node service: attacher tests
// need the identity and controller services only.
//
// The driver takes its cloud as an interface (pkg/cloud.Cloud); this program
// implements that interface the way the driver's real implementation
// (pkg/cloud/cloud.go) behaves on EC2, in three layers:
//
//   - the EC2 API itself (ec2AttachVolume, ec2DetachVolume, ...): volumes and
//     instances in maps behind one lock, attachments that go through EC2's
//     states (attaching, attached, detaching), and EC2's refusals as API errors
//     of the AWS SDK's own types, so that their text reads as a real SDK
//     error does ("operation error EC2: AttachVolume, https response error
//     StatusCode: 400, RequestID: ..., api error VolumeInUse: ...");
//   - the cloud.Cloud methods on top, doing what the real implementation does
//     with those answers: which EC2 errors become cloud.ErrNotFound, what is
//     wrapped and with which words, and device names chosen by the vendor's
//     own device manager (pkg/cloud/devicemanager), so that an instance whose
//     names are all taken fails as it does on AWS;
//   - an HTTP endpoint on loopback through which tests create volumes and
//     instances, read the attachments and the Controller(Un)Publish calls the
//     driver answered, and change the cloud behind the driver's back.
//
// What EC2 refuses, and how (the error codes are EC2's; the messages are our
// wording of them unless the driver's own sources quote EC2's):
//
//	attach, volume missing                  InvalidVolume.NotFound
//	attach, instance missing                found missing by DescribeInstances first: cloud.ErrNotFound
//	attach, other availability zone         InvalidVolume.ZoneMismatch
//	attach, volume in use by an instance    VolumeInUse (unless the volume has multi-attach, io2 only)
//	attach, instance out of attachment slots AttachmentLimitExceeded (see --instance-type, limit=)
//	attach, every device name taken          the device manager's "could not get a free device name"
//	detach, volume missing / not attached    InvalidVolume.NotFound / IncorrectState / InvalidAttachment.NotFound,
//	                                         which the driver's cloud turns into cloud.ErrNotFound (success)
//
// Every refusal carries a fresh request ID, as EC2's do, so the same refusal
// reads differently each time; tests that compare error texts replace the ID.
//
// Node IDs are EC2 instance IDs (i-...), volume IDs EC2 volume IDs (vol-...);
// tests choose them. The program prints "http <address>" and then "ready" on
// stdout once both servers listen.
package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/kubernetes-sigs/aws-ebs-csi-driver/pkg/cloud"
	"github.com/kubernetes-sigs/aws-ebs-csi-driver/pkg/cloud/devicemanager"
	"github.com/kubernetes-sigs/aws-ebs-csi-driver/pkg/driver"
)

// driverModule is the module whose version the program logs.
const driverModule = "github.com/kubernetes-sigs/aws-ebs-csi-driver"

// rootDevice is where every instance's root volume sits; EC2 reports it among
// the block device mappings, and the driver's device names never use it.
const rootDevice = "/dev/xvda"

// pollInterval is how often a waiting AttachDisk/DetachDisk looks at the
// attachment's state (the driver's cloud polls DescribeVolumes with a backoff
// starting at 1 s; ours only waits for our own timers, so it polls faster).
const pollInterval = 20 * time.Millisecond

func main() {
	endpoint := flag.String("endpoint", "/tmp/ebs-controller.sock", "Unix socket path of the CSI server (a unix:// prefix is accepted)")
	region := flag.String("region", "us-east-1", "the fake EC2's region")
	zone := flag.String("zone", "us-east-1a", "availability zone of instances and volumes created without one")
	zones := flag.String("zones", "us-east-1a,us-east-1b,us-east-1c", "comma-separated availability zones of the region")
	instanceType := flag.String("instance-type", "m5.large", "EC2 instance type of instances created without one (sets their attachment limit)")
	instances := flag.String("instances", "", "comma-separated instance IDs to create at start")
	volumes := flag.String("volumes", "", "comma-separated volume IDs to create at start (gp3, 10 GiB, in --zone)")
	latency := flag.Duration("latency", 0, "time an attachment takes to become attached, and to go away once detached")
	jitter := flag.Float64("jitter", 0.2, "relative jitter of --latency: each state change takes latency * (1 ± jitter), uniformly")
	httpAddr := flag.String("http", "127.0.0.1:0", "address of the test endpoint (loopback)")
	klog.InitFlags(nil)
	flag.Parse()

	if *jitter < 0 || *jitter > 1 {
		fmt.Fprintf(os.Stderr, "ebs-controller: --jitter must be within [0, 1], got %v\n", *jitter)
		os.Exit(2)
	}
	if err := checkInstanceType(*instanceType); err != nil {
		fmt.Fprintf(os.Stderr, "ebs-controller: --instance-type: %v\n", err)
		os.Exit(2)
	}

	ec := newFakeEC2(*region, *zone, splitList(*zones), *instanceType, *latency, *jitter)
	for _, id := range splitList(*instances) {
		if err := ec.createInstance(id, "", "", -1, 0); err != nil {
			klog.Fatalf("creating instance %s: %v", id, err)
		}
	}
	for _, id := range splitList(*volumes) {
		if err := ec.createVolume(volumeSpec{ID: id}); err != nil {
			klog.Fatalf("creating volume %s: %v", id, err)
		}
	}
	c := &fakeCloud{ec2: ec, dm: devicemanager.NewDeviceManager()}

	socket := strings.TrimPrefix(*endpoint, "unix://")
	// The options the driver's main sets in controller mode, from its own flag defaults.
	opts := &driver.Options{
		Mode:                              driver.ControllerMode,
		Endpoint:                          "unix://" + socket,
		ModifyVolumeRequestHandlerTimeout: driver.DefaultModifyVolumeRequestHandlerTimeout,
	}
	// The driver value serves the identity service; its controller service is
	// built from the same constructor NewDriver uses, so this program can
	// register it on a server of its own (with the recording interceptor).
	identity, err := driver.NewDriver(c, opts, nil, nil, nil)
	if err != nil {
		klog.Fatalf("creating the driver: %v", err)
	}
	controller := driver.NewControllerService(c, opts)

	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		klog.Fatalf("removing %s: %v", socket, err)
	}
	csiListener, err := net.Listen("unix", socket)
	if err != nil {
		klog.Fatalf("listening on %s: %v", socket, err)
	}
	rec := &recorder{}
	server := grpc.NewServer(grpc.UnaryInterceptor(rec.intercept))
	csi.RegisterIdentityServer(server, identity)
	csi.RegisterControllerServer(server, controller)

	httpListener, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		klog.Fatalf("listening on %s: %v", *httpAddr, err)
	}
	httpServer := &http.Server{Handler: testEndpoint(ec, rec), ReadHeaderTimeout: 10 * time.Second}

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
	klog.Infof("driver %s %s serving %s; region %s, zone %s, latency %v ± %.0f%%",
		driver.DriverName, driverVersion(), socket, *region, *zone, *latency, *jitter*100)

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

// checkInstanceType rejects what the vendor's limit tables cannot classify
// (they panic on a name without exactly one dot).
func checkInstanceType(t string) error {
	if strings.Count(t, ".") != 1 || strings.HasPrefix(t, ".") || strings.HasSuffix(t, ".") {
		return fmt.Errorf("%q is not an instance type (family.size)", t)
	}
	return nil
}

// defaultAttachmentLimit is how many volumes besides the root volume an
// instance of type t takes before EC2 refuses another, with one network
// interface and no instance store: the number the driver's node service
// reports to Kubernetes for such an instance (pkg/driver/node.go,
// getVolumesLimit), computed from the vendor's own tables.
func defaultAttachmentLimit(t string) int {
	nitro := cloud.IsNitroInstanceType(t)
	slots := cloud.GetMaxAttachments(nitro)
	ebsMax, capped := cloud.GetEBSLimitForInstanceType(t)
	if capped {
		slots = min(slots, ebsMax)
	}
	const enis, root = 1, 1
	switch {
	case cloud.GetDedicatedLimitForInstanceType(t) != 0:
		slots = cloud.GetDedicatedLimitForInstanceType(t)
	case nitro && capped:
		slots -= (enis - 1) + cloud.GetReservedSlotsForInstanceType(t)
	case nitro:
		slots -= enis + cloud.GetReservedSlotsForInstanceType(t)
	}
	return max1(slots - root)
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

// === the fake EC2 ===

// fakeEC2 holds the region's volumes and instances. Every method takes mu;
// methods named ec2* answer as the EC2 API operation of that name does.
type fakeEC2 struct {
	region, zone, instanceType string
	zones                      []string
	latency                    time.Duration
	jitter                     float64

	// mu guards every field below, and every volume, instance and attachment.
	mu sync.Mutex
	// rng draws the jitter.
	rng       *rand.Rand
	volumes   map[string]*volume
	instances map[string]*instance
	// created counts volumes made by CreateVolume, for their IDs.
	created int
}

// volume is an EBS volume.
type volume struct {
	id, zone, volumeType string
	sizeGiB              int32
	// multiAttach is EBS Multi-Attach (io2 only): several instances at once.
	multiAttach bool
	tags        map[string]string
	// attachments by instance ID; an entry exists from AttachVolume until the
	// detachment has completed.
	attachments map[string]*attachment
}

// attachment is a volume's attachment to one instance.
type attachment struct {
	device string
	state  types.VolumeAttachmentState
}

// instance is an EC2 instance (running; a terminated one is deleted).
type instance struct {
	id, zone, instanceType string
	// limit is how many volumes besides the root volume EC2 lets it have.
	limit int
	// otherDevices are device names held by volumes this program does not
	// model (from the AMI, or attached by someone else): they take device
	// names and attachment slots.
	otherDevices []string
}

func newFakeEC2(region, zone string, zones []string, instanceType string, latency time.Duration, jitter float64) *fakeEC2 {
	if len(zones) == 0 {
		zones = []string{zone}
	}
	return &fakeEC2{
		region: region, zone: zone, zones: zones, instanceType: instanceType,
		latency: latency, jitter: jitter,
		rng:       rand.New(rand.NewSource(time.Now().UnixNano())),
		volumes:   map[string]*volume{},
		instances: map[string]*instance{},
	}
}

// ec2Error is an EC2 API error as the AWS SDK hands it to the driver: an
// operation error around an HTTP 400 response error around the API error,
// with a request ID of its own (a random UUID, the form of EC2's).
func ec2Error(operation, code, message string) error {
	var id [16]byte
	_, _ = crand.Read(id[:])
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant
	h := hex.EncodeToString(id[:])
	requestID := h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	return &smithy.OperationError{
		ServiceID:     "EC2",
		OperationName: operation,
		Err: &awshttp.ResponseError{
			ResponseError: &smithyhttp.ResponseError{
				Response: &smithyhttp.Response{Response: &http.Response{StatusCode: http.StatusBadRequest}},
				Err:      &smithy.GenericAPIError{Code: code, Message: message, Fault: smithy.FaultClient},
			},
			RequestID: requestID,
		},
	}
}

// apiCode is the EC2 error code inside err, if any.
func apiCode(err error) string {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode()
	}
	return ""
}

// stateDelay draws latency ± jitter; mu must be held.
func (e *fakeEC2) stateDelay() time.Duration {
	if e.latency <= 0 {
		return 0
	}
	f := 1 + e.jitter*(2*e.rng.Float64()-1)
	return time.Duration(float64(e.latency) * f)
}

// volumeSpec is what a test (or CreateDisk) asks of a new volume.
type volumeSpec struct {
	ID          string
	Zone        string
	Type        string
	SizeGiB     int32
	MultiAttach bool
	Tags        map[string]string
}

func (e *fakeEC2) createVolume(s volumeSpec) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.createVolumeLocked(s)
}

func (e *fakeEC2) createVolumeLocked(s volumeSpec) error {
	if s.ID == "" {
		return errors.New("a volume needs an ID")
	}
	if _, ok := e.volumes[s.ID]; ok {
		return fmt.Errorf("volume %s already exists", s.ID)
	}
	if s.Zone == "" {
		s.Zone = e.zone
	}
	if s.Type == "" {
		s.Type = "gp3"
	}
	if s.SizeGiB == 0 {
		s.SizeGiB = 10
	}
	if s.MultiAttach && s.Type != "io2" && s.Type != "io1" {
		return ec2Error("CreateVolume", "InvalidParameterCombination",
			fmt.Sprintf("Multi-Attach is not supported for volume type %s.", s.Type))
	}
	tags := map[string]string{}
	for k, v := range s.Tags {
		tags[k] = v
	}
	e.volumes[s.ID] = &volume{
		id: s.ID, zone: s.Zone, volumeType: s.Type, sizeGiB: s.SizeGiB,
		multiAttach: s.MultiAttach, tags: tags, attachments: map[string]*attachment{},
	}
	return nil
}

// deleteVolume is EC2's DeleteVolume: a volume in use is refused.
func (e *fakeEC2) deleteVolume(id string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.volumes[id]
	if !ok {
		return ec2Error("DeleteVolume", "InvalidVolume.NotFound", fmt.Sprintf("The volume '%s' does not exist.", id))
	}
	if len(v.attachments) > 0 {
		return ec2Error("DeleteVolume", "VolumeInUse", fmt.Sprintf("Volume %s is currently attached to %s", id, strings.Join(v.instanceIDs(), ", ")))
	}
	delete(e.volumes, id)
	return nil
}

// instanceIDs lists the instances the volume is attached to, sorted.
func (v *volume) instanceIDs() []string {
	out := make([]string, 0, len(v.attachments))
	for id := range v.attachments {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// createInstance launches an instance; limit < 0 takes the instance type's
// default, and otherDevices device names are taken by volumes we do not model
// (chosen by the vendor's device name allocator, as the driver would).
func (e *fakeEC2) createInstance(id, zone, instanceType string, limit, otherDevices int) error {
	if id == "" {
		return errors.New("an instance needs an ID")
	}
	if instanceType == "" {
		instanceType = e.instanceType
	}
	if err := checkInstanceType(instanceType); err != nil {
		return err
	}
	if zone == "" {
		zone = e.zone
	}
	if limit < 0 {
		limit = defaultAttachmentLimit(instanceType)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.instances[id]; ok {
		return fmt.Errorf("instance %s already exists", id)
	}
	inst := &instance{id: id, zone: zone, instanceType: instanceType, limit: limit}
	e.instances[id] = inst
	names := devicemanager.NewDeviceManager()
	for k := 0; k < otherDevices; k++ {
		dev, err := names.NewDevice(e.describeLocked(inst), fmt.Sprintf("vol-other-%d", k), &sync.Map{})
		if err != nil {
			break // every name is taken
		}
		inst.otherDevices = append(inst.otherDevices, dev.Path)
		dev.Release(true)
	}
	return nil
}

// terminateInstance ends an instance; EC2 detaches its volumes.
func (e *fakeEC2) terminateInstance(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.instances[id]; !ok {
		return false
	}
	delete(e.instances, id)
	for _, v := range e.volumes {
		delete(v.attachments, id)
	}
	return true
}

// describeLocked is the instance as DescribeInstances reports it: its block
// device mappings are the root volume, the other devices and our volumes'
// attachments (attaching ones included, as EC2 lists them).
func (e *fakeEC2) describeLocked(inst *instance) *types.Instance {
	mapping := func(device, volumeID string, st types.AttachmentStatus) types.InstanceBlockDeviceMapping {
		return types.InstanceBlockDeviceMapping{
			DeviceName: aws.String(device),
			Ebs:        &types.EbsInstanceBlockDevice{VolumeId: aws.String(volumeID), Status: st},
		}
	}
	out := &types.Instance{
		InstanceId:     aws.String(inst.id),
		InstanceType:   types.InstanceType(inst.instanceType),
		Placement:      &types.Placement{AvailabilityZone: aws.String(inst.zone)},
		RootDeviceName: aws.String(rootDevice),
		BlockDeviceMappings: []types.InstanceBlockDeviceMapping{
			mapping(rootDevice, "vol-root-"+strings.TrimPrefix(inst.id, "i-"), types.AttachmentStatusAttached),
		},
	}
	for k, d := range inst.otherDevices {
		out.BlockDeviceMappings = append(out.BlockDeviceMappings, mapping(d, fmt.Sprintf("vol-other-%d", k), types.AttachmentStatusAttached))
	}
	for _, id := range e.sortedVolumeIDs() {
		if a, ok := e.volumes[id].attachments[inst.id]; ok {
			out.BlockDeviceMappings = append(out.BlockDeviceMappings, mapping(a.device, id, types.AttachmentStatus(a.state)))
		}
	}
	return out
}

func (e *fakeEC2) sortedVolumeIDs() []string {
	out := make([]string, 0, len(e.volumes))
	for id := range e.volumes {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// usedSlotsLocked counts an instance's attachments besides the root volume.
func (e *fakeEC2) usedSlotsLocked(inst *instance) int {
	n := len(inst.otherDevices)
	for _, v := range e.volumes {
		if _, ok := v.attachments[inst.id]; ok {
			n++
		}
	}
	return n
}

// ec2DescribeInstance is DescribeInstances for one ID.
func (e *fakeEC2) ec2DescribeInstance(id string) (*types.Instance, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	inst, ok := e.instances[id]
	if !ok {
		return nil, ec2Error("DescribeInstances", "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
	}
	return e.describeLocked(inst), nil
}

// ec2AttachVolume is AttachVolume: the checks EC2 makes, then an attachment
// in state attaching that becomes attached after the configured latency.
func (e *fakeEC2) ec2AttachVolume(volumeID, instanceID, device string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	refuse := func(code, message string) error {
		return ec2Error("AttachVolume", code, message)
	}
	v, ok := e.volumes[volumeID]
	if !ok {
		return refuse("InvalidVolume.NotFound", fmt.Sprintf("The volume '%s' does not exist.", volumeID))
	}
	inst, ok := e.instances[instanceID]
	if !ok {
		return refuse("InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", instanceID))
	}
	if v.zone != inst.zone {
		return refuse("InvalidVolume.ZoneMismatch",
			fmt.Sprintf("The volume '%s' is not in the same availability zone as instance '%s'", volumeID, instanceID))
	}
	if _, ok := v.attachments[instanceID]; ok || (len(v.attachments) > 0 && !v.multiAttach) {
		return refuse("VolumeInUse", fmt.Sprintf("%s is already attached to an instance", volumeID))
	}
	for _, m := range e.describeLocked(inst).BlockDeviceMappings {
		if aws.ToString(m.DeviceName) == device {
			// The wording the driver's own tests quote (pkg/cloud/cloud_test.go).
			return refuse("InvalidParameterValue",
				fmt.Sprintf("Invalid value '%s' for unixDevice. Attachment point %s is already in use", device, device))
		}
	}
	if e.usedSlotsLocked(inst) >= inst.limit {
		return refuse("AttachmentLimitExceeded",
			fmt.Sprintf("You have reached the maximum number of attachments (%d) for instance '%s'", inst.limit, instanceID))
	}
	a := &attachment{device: device, state: types.VolumeAttachmentStateAttaching}
	v.attachments[instanceID] = a
	e.afterDelay(func() {
		if v.attachments[instanceID] == a && a.state == types.VolumeAttachmentStateAttaching {
			a.state = types.VolumeAttachmentStateAttached
		}
	})
	return nil
}

// ec2DetachVolume is DetachVolume: the attachment goes to detaching and is
// gone after the configured latency.
func (e *fakeEC2) ec2DetachVolume(volumeID, instanceID string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	refuse := func(code, message string) error {
		return ec2Error("DetachVolume", code, message)
	}
	v, ok := e.volumes[volumeID]
	if !ok {
		return refuse("InvalidVolume.NotFound", fmt.Sprintf("The volume '%s' does not exist.", volumeID))
	}
	if len(v.attachments) == 0 {
		return refuse("IncorrectState", fmt.Sprintf("Volume '%s' is in the 'available' state.", volumeID))
	}
	a, ok := v.attachments[instanceID]
	if !ok {
		return refuse("InvalidAttachment.NotFound",
			fmt.Sprintf("The volume '%s' is not attached to instance '%s'", volumeID, instanceID))
	}
	if a.state == types.VolumeAttachmentStateDetaching {
		return nil
	}
	a.state = types.VolumeAttachmentStateDetaching
	e.afterDelay(func() {
		if v.attachments[instanceID] == a {
			delete(v.attachments, instanceID)
		}
	})
	return nil
}

// afterDelay runs f under mu after latency ± jitter (at once, still under
// mu, without latency); mu must be held.
func (e *fakeEC2) afterDelay(f func()) {
	d := e.stateDelay()
	if d <= 0 {
		f()
		return
	}
	time.AfterFunc(d, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		f()
	})
}

// attachmentState is the state of the volume's attachment to the instance as
// DescribeVolumes reports it ("detached" when there is none).
func (e *fakeEC2) attachmentState(volumeID, instanceID string) (types.VolumeAttachmentState, string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.volumes[volumeID]
	if !ok {
		return "", "", ec2Error("DescribeVolumes", "InvalidVolume.NotFound", fmt.Sprintf("The volume '%s' does not exist.", volumeID))
	}
	if a, ok := v.attachments[instanceID]; ok {
		return a.state, a.device, nil
	}
	return types.VolumeAttachmentStateDetached, "", nil
}

// === cloud.Cloud over the fake EC2 ===

// fakeCloud is the driver's cloud.Cloud, answering as the real implementation
// (pkg/cloud/cloud.go) answers given EC2's responses.
type fakeCloud struct {
	ec2 *fakeEC2
	// dm is the vendor's device manager: device names, and the names of
	// attachments in flight, per instance.
	dm devicemanager.DeviceManager
}

var _ cloud.Cloud = (*fakeCloud)(nil)

// getInstance is the real cloud's: an unknown instance is cloud.ErrNotFound.
func (c *fakeCloud) getInstance(nodeID string) (*types.Instance, error) {
	inst, err := c.ec2.ec2DescribeInstance(nodeID)
	if err != nil {
		if apiCode(err) == "InvalidInstanceID.NotFound" {
			return nil, cloud.ErrNotFound
		}
		return nil, fmt.Errorf("error listing AWS instances: %w", err)
	}
	return inst, nil
}

func (c *fakeCloud) AttachDisk(ctx context.Context, volumeID, nodeID string) (string, error) {
	inst, err := c.getInstance(nodeID)
	if err != nil {
		return "", err
	}
	device, err := c.dm.NewDevice(inst, volumeID, &sync.Map{})
	if err != nil {
		return "", err
	}
	defer device.Release(false)
	if !device.IsAlreadyAssigned {
		if err := c.ec2.ec2AttachVolume(volumeID, nodeID, device.Path); err != nil {
			return "", fmt.Errorf("could not attach volume %q to node %q: %w", volumeID, nodeID, err)
		}
	}
	if _, err := c.WaitForAttachmentState(ctx, types.VolumeAttachmentStateAttached, volumeID, nodeID, device.Path, device.IsAlreadyAssigned); err != nil {
		device.Taint()
		return "", err
	}
	return device.Path, nil
}

func (c *fakeCloud) DetachDisk(ctx context.Context, volumeID, nodeID string) error {
	inst, err := c.getInstance(nodeID)
	if err != nil {
		return err
	}
	device, err := c.dm.GetDevice(inst, volumeID)
	if err != nil {
		return err
	}
	defer device.Release(true)
	if err := c.ec2.ec2DetachVolume(volumeID, nodeID); err != nil {
		switch apiCode(err) {
		case "IncorrectState", "InvalidAttachment.NotFound", "InvalidVolume.NotFound":
			return cloud.ErrNotFound
		}
		return fmt.Errorf("could not detach volume %q from node %q: %w", volumeID, nodeID, err)
	}
	_, err = c.WaitForAttachmentState(ctx, types.VolumeAttachmentStateDetached, volumeID, nodeID, "", false)
	return err
}

// WaitForAttachmentState waits until the volume's attachment to the instance
// is in the expected state, with the real implementation's early exits: a
// volume gone counts as detached and fails an attach; an attachment the
// instance listed (alreadyAssigned) but the volume no longer has fails at once.
func (c *fakeCloud) WaitForAttachmentState(ctx context.Context, expected types.VolumeAttachmentState, volumeID, instanceID, device string, alreadyAssigned bool) (*types.VolumeAttachment, error) {
	for {
		state, got, err := c.ec2.attachmentState(volumeID, instanceID)
		switch {
		case err != nil && expected == types.VolumeAttachmentStateDetached:
			return nil, nil
		case err != nil:
			return nil, err
		case expected == types.VolumeAttachmentStateAttached && alreadyAssigned && state == types.VolumeAttachmentStateDetached:
			return nil, fmt.Errorf("attachment of disk %q failed, expected device to be attached but was %s", volumeID, state)
		case state == expected && expected == types.VolumeAttachmentStateDetached:
			return nil, nil
		case state == expected && (device == "" || got == device):
			return &types.VolumeAttachment{
				VolumeId: aws.String(volumeID), InstanceId: aws.String(instanceID),
				Device: aws.String(got), State: state,
			}, nil
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (c *fakeCloud) CreateDisk(ctx context.Context, volumeName string, o *cloud.DiskOptions) (*cloud.Disk, error) {
	if o.IOPS > 0 && o.IOPSPerGB > 0 {
		return nil, errors.New("invalid StorageClass parameters; specify either IOPS or IOPSPerGb, not both")
	}
	volumeType := o.VolumeType
	if volumeType == "" {
		volumeType = cloud.VolumeTypeGP3
	}
	switch volumeType {
	case cloud.VolumeTypeGP2, cloud.VolumeTypeGP3, cloud.VolumeTypeIO1, cloud.VolumeTypeIO2,
		cloud.VolumeTypeSC1, cloud.VolumeTypeST1, cloud.VolumeTypeStandard:
	default:
		return nil, fmt.Errorf("invalid AWS VolumeType %q", o.VolumeType)
	}
	if o.MultiAttachEnabled && volumeType != cloud.VolumeTypeIO2 {
		return nil, errors.New("CreateDisk: multi-attach is only supported for io2 volumes")
	}
	e := c.ec2
	e.mu.Lock()
	defer e.mu.Unlock()
	zone := o.AvailabilityZone
	if zone == "" {
		zone = e.zones[e.rng.Intn(len(e.zones))]
	}
	e.created++
	id := fmt.Sprintf("vol-%017x", e.created)
	size := int32((o.CapacityBytes + (1<<30 - 1)) >> 30)
	if err := e.createVolumeLocked(volumeSpec{ID: id, Zone: zone, Type: volumeType, SizeGiB: size, MultiAttach: o.MultiAttachEnabled, Tags: o.Tags}); err != nil {
		return nil, fmt.Errorf("could not create volume in EC2: %w", err)
	}
	return &cloud.Disk{VolumeID: id, CapacityGiB: size, AvailabilityZone: zone, SnapshotID: o.SnapshotID}, nil
}

func (c *fakeCloud) DeleteDisk(ctx context.Context, volumeID string) (bool, error) {
	if err := c.ec2.deleteVolume(volumeID); err != nil {
		if apiCode(err) == "InvalidVolume.NotFound" {
			return false, cloud.ErrNotFound
		}
		return false, fmt.Errorf("DeleteDisk could not delete volume: %w", err)
	}
	return true, nil
}

func (c *fakeCloud) ModifyTags(ctx context.Context, volumeID string, o cloud.ModifyTagsOptions) error {
	e := c.ec2
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.volumes[volumeID]
	if !ok {
		return cloud.ErrNotFound
	}
	for k, val := range o.TagsToAdd {
		v.tags[k] = val
	}
	for _, k := range o.TagsToDelete {
		delete(v.tags, k)
	}
	return nil
}

func (c *fakeCloud) ResizeOrModifyDisk(ctx context.Context, volumeID string, newSizeBytes int64, o *cloud.ModifyDiskOptions) (int32, error) {
	e := c.ec2
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.volumes[volumeID]
	if !ok {
		return 0, cloud.ErrNotFound
	}
	if size := int32((newSizeBytes + (1<<30 - 1)) >> 30); size > v.sizeGiB {
		v.sizeGiB = size
	}
	if o != nil && o.VolumeType != "" {
		v.volumeType = o.VolumeType
	}
	return v.sizeGiB, nil
}

// diskLocked is the cloud.Disk of a volume; mu must be held.
func diskLocked(v *volume) *cloud.Disk {
	return &cloud.Disk{VolumeID: v.id, CapacityGiB: v.sizeGiB, AvailabilityZone: v.zone, Attachments: v.instanceIDs()}
}

func (c *fakeCloud) GetDiskByName(ctx context.Context, name string, capacityBytes int64) (*cloud.Disk, error) {
	e := c.ec2
	e.mu.Lock()
	defer e.mu.Unlock()
	var found []*volume
	for _, id := range e.sortedVolumeIDs() {
		if e.volumes[id].tags[cloud.VolumeNameTagKey] == name {
			found = append(found, e.volumes[id])
		}
	}
	switch {
	case len(found) > 1:
		return nil, cloud.ErrMultiDisks
	case len(found) == 0:
		return nil, cloud.ErrNotFound
	case int64(found[0].sizeGiB)<<30 != capacityBytes:
		return nil, cloud.ErrDiskExistsDiffSize
	}
	d := diskLocked(found[0])
	d.Attachments = nil // the real GetDiskByName does not report them
	return d, nil
}

func (c *fakeCloud) GetDiskByID(ctx context.Context, volumeID string) (*cloud.Disk, error) {
	e := c.ec2
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.volumes[volumeID]
	if !ok {
		return nil, cloud.ErrNotFound
	}
	return diskLocked(v), nil
}

// errNoSnapshots answers every snapshot operation: this EC2 has none.
var errNoSnapshots = errors.New("snapshots are not modelled by this fake EC2")

func (c *fakeCloud) CreateSnapshot(ctx context.Context, volumeID string, o *cloud.SnapshotOptions) (*cloud.Snapshot, error) {
	return nil, errNoSnapshots
}

func (c *fakeCloud) DeleteSnapshot(ctx context.Context, snapshotID string) (bool, error) {
	return false, cloud.ErrNotFound
}

func (c *fakeCloud) GetSnapshotByName(ctx context.Context, name string) (*cloud.Snapshot, error) {
	return nil, cloud.ErrNotFound
}

func (c *fakeCloud) GetSnapshotByID(ctx context.Context, snapshotID string) (*cloud.Snapshot, error) {
	return nil, cloud.ErrNotFound
}

func (c *fakeCloud) ListSnapshots(ctx context.Context, volumeID string, maxResults int32, nextToken string) (*cloud.ListSnapshotsResponse, error) {
	return &cloud.ListSnapshotsResponse{}, nil
}

func (c *fakeCloud) EnableFastSnapshotRestores(ctx context.Context, availabilityZones []string, snapshotID string) (*ec2.EnableFastSnapshotRestoresOutput, error) {
	return nil, errNoSnapshots
}

func (c *fakeCloud) AvailabilityZones(ctx context.Context) (map[string]struct{}, error) {
	out := map[string]struct{}{}
	for _, z := range c.ec2.zones {
		out[z] = struct{}{}
	}
	return out, nil
}

// === recorded calls ===

// call is one ControllerPublishVolume or ControllerUnpublishVolume the driver answered.
type call struct {
	Method   string `json:"method"`
	VolumeID string `json:"volumeId"`
	NodeID   string `json:"nodeId"`
	Readonly bool   `json:"readonly"`
	// AccessMode is the CSI access mode name and Block whether the volume is
	// a raw block device (publish only).
	AccessMode string `json:"accessMode,omitempty"`
	Block      bool   `json:"block,omitempty"`
	// DevicePath is the publish context's devicePath (a successful publish).
	DevicePath string `json:"devicePath,omitempty"`
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

// intercept records each Controller(Un)PublishVolume with its answer.
func (r *recorder) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	st := status.Convert(err)
	c := call{Code: st.Code().String(), Message: st.Message(), StartMs: start.UnixMilli(), EndMs: time.Now().UnixMilli()}
	switch q := req.(type) {
	case *csi.ControllerPublishVolumeRequest:
		c.Method, c.VolumeID, c.NodeID, c.Readonly = "ControllerPublishVolume", q.GetVolumeId(), q.GetNodeId(), q.GetReadonly()
		c.AccessMode = q.GetVolumeCapability().GetAccessMode().GetMode().String()
		c.Block = q.GetVolumeCapability().GetBlock() != nil
		if p, ok := resp.(*csi.ControllerPublishVolumeResponse); ok && p != nil {
			c.DevicePath = p.GetPublishContext()[driver.DevicePathKey]
		}
	case *csi.ControllerUnpublishVolumeRequest:
		c.Method, c.VolumeID, c.NodeID = "ControllerUnpublishVolume", q.GetVolumeId(), q.GetNodeId()
	default:
		return resp, err
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	return resp, err
}

func (r *recorder) list() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call{}, r.calls...)
}

// === the test endpoint ===

// attachmentView is one volume attached (or attaching, or detaching) to an instance.
type attachmentView struct {
	Volume string `json:"volume"`
	Device string `json:"device"`
	State  string `json:"state"`
}

type volumeView struct {
	ID          string   `json:"id"`
	Zone        string   `json:"zone"`
	Type        string   `json:"type"`
	SizeGiB     int32    `json:"sizeGiB"`
	MultiAttach bool     `json:"multiAttach"`
	State       string   `json:"state"`
	AttachedTo  []string `json:"attachedTo"`
}

type instanceView struct {
	ID           string `json:"id"`
	Zone         string `json:"zone"`
	Type         string `json:"type"`
	Limit        int    `json:"limit"`
	OtherDevices int    `json:"otherDevices"`
}

// testEndpoint serves, all in JSON:
//
//	GET    /attachments      {"<instance>": [{"volume", "device", "state"}, ...], ...} (every instance; our volumes only)
//	GET    /volumes          [{"id", "zone", "type", "sizeGiB", "multiAttach", "state", "attachedTo"}, ...]
//	GET    /instances        [{"id", "zone", "type", "limit", "otherDevices"}, ...]
//	GET    /calls            the Controller(Un)PublishVolume calls, in order of answer
//	POST   /volumes?id=V[&zone=Z][&type=T][&sizeGiB=N][&multiAttach=true]   create a volume
//	DELETE /volumes?id=V     delete a volume (EC2 refuses one in use: 409)
//	POST   /instances?id=I[&zone=Z][&type=T][&limit=N][&otherDevices=N]   launch an instance
//	DELETE /instances?id=I   terminate an instance (its volumes are detached)
//	POST   /attach?volume=V&instance=I   attach out of band, at once (EC2's refusals apply: 409)
//	POST   /detach?volume=V&instance=I   detach out of band, at once
//
// A refusal's body is EC2's error text.
func testEndpoint(e *fakeEC2, rec *recorder) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	fail := func(w http.ResponseWriter, code int, err error) { http.Error(w, err.Error(), code) }
	intArg := func(r *http.Request, name string, def int) (int, error) {
		s := r.URL.Query().Get(name)
		if s == "" {
			return def, nil
		}
		return strconv.Atoi(s)
	}
	mux.HandleFunc("GET /attachments", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		out := map[string][]attachmentView{}
		for id := range e.instances {
			out[id] = []attachmentView{}
		}
		for _, vid := range e.sortedVolumeIDs() {
			for iid, a := range e.volumes[vid].attachments {
				out[iid] = append(out[iid], attachmentView{Volume: vid, Device: a.device, State: string(a.state)})
			}
		}
		e.mu.Unlock()
		reply(w, out)
	})
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		out := []volumeView{}
		for _, id := range e.sortedVolumeIDs() {
			v := e.volumes[id]
			state := "available"
			if len(v.attachments) > 0 {
				state = "in-use"
			}
			out = append(out, volumeView{ID: id, Zone: v.zone, Type: v.volumeType, SizeGiB: v.sizeGiB,
				MultiAttach: v.multiAttach, State: state, AttachedTo: v.instanceIDs()})
		}
		e.mu.Unlock()
		reply(w, out)
	})
	mux.HandleFunc("GET /instances", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		out := []instanceView{}
		for _, inst := range e.instances {
			out = append(out, instanceView{ID: inst.id, Zone: inst.zone, Type: inst.instanceType, Limit: inst.limit, OtherDevices: len(inst.otherDevices)})
		}
		e.mu.Unlock()
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		reply(w, out)
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, r *http.Request) { reply(w, rec.list()) })
	mux.HandleFunc("POST /volumes", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		size, err := intArg(r, "sizeGiB", 10)
		if err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		spec := volumeSpec{ID: q.Get("id"), Zone: q.Get("zone"), Type: q.Get("type"), SizeGiB: int32(size), MultiAttach: q.Get("multiAttach") == "true"}
		if err := e.createVolume(spec); err != nil {
			fail(w, http.StatusConflict, err)
			return
		}
		reply(w, "created")
	})
	mux.HandleFunc("DELETE /volumes", func(w http.ResponseWriter, r *http.Request) {
		if err := e.deleteVolume(r.URL.Query().Get("id")); err != nil {
			fail(w, http.StatusConflict, err)
			return
		}
		reply(w, "deleted")
	})
	mux.HandleFunc("POST /instances", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit, err := intArg(r, "limit", -1)
		if err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		others, err := intArg(r, "otherDevices", 0)
		if err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		if err := e.createInstance(q.Get("id"), q.Get("zone"), q.Get("type"), limit, others); err != nil {
			fail(w, http.StatusConflict, err)
			return
		}
		reply(w, "created")
	})
	mux.HandleFunc("DELETE /instances", func(w http.ResponseWriter, r *http.Request) {
		if !e.terminateInstance(r.URL.Query().Get("id")) {
			fail(w, http.StatusNotFound, fmt.Errorf("no instance %q", r.URL.Query().Get("id")))
			return
		}
		reply(w, "terminated")
	})
	mux.HandleFunc("POST /attach", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if err := e.attachAtOnce(q.Get("volume"), q.Get("instance")); err != nil {
			fail(w, http.StatusConflict, err)
			return
		}
		reply(w, "attached")
	})
	mux.HandleFunc("POST /detach", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if err := e.detachAtOnce(q.Get("volume"), q.Get("instance")); err != nil {
			fail(w, http.StatusConflict, err)
			return
		}
		reply(w, "detached")
	})
	return mux
}

// attachAtOnce attaches out of band at the first free device name (as an
// operator would pick one), attached at once.
func (e *fakeEC2) attachAtOnce(volumeID, instanceID string) error {
	inst, err := e.ec2DescribeInstance(instanceID)
	if err != nil {
		return err
	}
	dev, err := devicemanager.NewDeviceManager().NewDevice(inst, volumeID, &sync.Map{})
	if err != nil {
		return err
	}
	dev.Release(true)
	if dev.IsAlreadyAssigned {
		return ec2Error("AttachVolume", "VolumeInUse", fmt.Sprintf("%s is already attached to an instance", volumeID))
	}
	if err := e.ec2AttachVolume(volumeID, instanceID, dev.Path); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.volumes[volumeID].attachments[instanceID]; ok {
		a.state = types.VolumeAttachmentStateAttached
	}
	return nil
}

// detachAtOnce detaches out of band, the attachment gone at once.
func (e *fakeEC2) detachAtOnce(volumeID, instanceID string) error {
	if err := e.ec2DetachVolume(volumeID, instanceID); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if v, ok := e.volumes[volumeID]; ok {
		delete(v.attachments, instanceID)
	}
	return nil
}
