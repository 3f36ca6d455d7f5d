// Command translation-oracle is the reference for attacher-hub's CSI-migration
// translation (tests/translation_oracle.rs). It runs, for each JSON line read
// from stdin, the steps external-attacher v4.13.0 takes from a
// VolumeAttachment's source to the CSI volume it publishes, using the same
// k8s.io/csi-translation-lib version the reference csi-attacher is built with,
// and prints one JSON line per input line.
//
// What external-attacher does (pkg/controller/csi_handler.go, v4.13.0):
//
//   - PersistentVolume source (csiAttach, csiDetach): if IsPVMigratable(pv),
//     pv = TranslateInTreePVToCSI(pv), an error being wrapped as
//     "failed to translate in tree pv to CSI: <err>" and the call marked
//     migrated; then the PV's CSI source, or the error "pv spec contained
//     non-csi source that was not migrated".
//   - Inline source (va.spec.source.inlineVolumeSpec, written by
//     kube-controller-manager): used as it is, never translated by the
//     attacher; no CSI source gives "inline volume spec contains nil CSI
//     source"; calls for it are not marked migrated.
//   - The ListVolumes reconciler (isMigratable) repairs the volume handle with
//     RepairVolumeHandle(csiSource.Driver, handle, nodeID) for in-tree PVs and
//     for every inline volume, and skips the VA when that fails.
//
// Input, one object per line:
//
//	{"case": "...", "pv": {PersistentVolume}, "nodeID": "..."}
//	{"case": "...", "inlineVolumeSpec": {PersistentVolumeSpec}, "nodeID": "..."}
//	{"case": "...", "podVolume": {Volume}, "podNamespace": "...", "nodeID": "..."}
//
// "podVolume" first does kube-controller-manager's part,
// TranslateInTreeInlineVolumeToCSI, whose resulting spec is what a
// VolumeAttachment's inlineVolumeSpec holds; the output then carries that
// spec ("inlineVolumeSpec") and what the attacher makes of it. "nodeID" is
// optional; with it the output has the reconciler's repaired handle.
//
// Output, one object per line, in input order:
//
//	{"case": "...", "error": "<text external-attacher saves in attachError/detachError>"}
//	{"case": "...", "kcmError": "<TranslateInTreeInlineVolumeToCSI error>"}
//	{"case": "...", "volume": {what the attacher reads}, "repair": {...}}
//
// A line that is not valid JSON gives {"case": "", "inputError": "..."}.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	v1 "k8s.io/api/core/v1"
	kjson "k8s.io/apimachinery/pkg/util/json"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

type input struct {
	Case             string                   `json:"case"`
	PV               *v1.PersistentVolume     `json:"pv,omitempty"`
	InlineVolumeSpec *v1.PersistentVolumeSpec `json:"inlineVolumeSpec,omitempty"`
	PodVolume        *v1.Volume               `json:"podVolume,omitempty"`
	PodNamespace     string                   `json:"podNamespace,omitempty"`
	NodeID           *string                  `json:"nodeID,omitempty"`
}

// secretRef is a SecretReference with both fields always present.
type secretRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// volume is every field of the (translated) spec that external-attacher
// reads: the CSI source for ControllerPublish/Unpublish and secrets, the spec
// for the volume capability, and the two "migrated" notions.
type volume struct {
	Driver                     string            `json:"driver"`
	VolumeHandle               string            `json:"volumeHandle"`
	ReadOnly                   bool              `json:"readOnly"`
	FSType                     string            `json:"fsType"`
	VolumeAttributes           map[string]string `json:"volumeAttributes"`
	ControllerPublishSecretRef *secretRef        `json:"controllerPublishSecretRef"`
	NodeStageSecretRef         *secretRef        `json:"nodeStageSecretRef"`
	NodePublishSecretRef       *secretRef        `json:"nodePublishSecretRef"`
	ControllerExpandSecretRef  *secretRef        `json:"controllerExpandSecretRef"`
	NodeExpandSecretRef        *secretRef        `json:"nodeExpandSecretRef"`
	AccessModes                []string          `json:"accessModes"`
	VolumeMode                 *string           `json:"volumeMode"`
	MountOptions               []string          `json:"mountOptions"`
	// markAsMigrated(ctx, migratable) of csiAttach and csiDetach: the
	// "migrated" label of csi_sidecar_operations_seconds.
	Migrated bool `json:"migrated"`
	// isMigratable of the ListVolumes reconciler: whether it repairs the handle.
	ReconcileMigratable bool `json:"reconcileMigratable"`
}

// repair is the reconciler's RepairVolumeHandle result: the handle it looks
// up in ListVolumes, or the error that makes it skip the VA.
type repair struct {
	Handle *string `json:"handle"`
	Error  string  `json:"error,omitempty"`
}

type output struct {
	Case             string                   `json:"case"`
	InputError       string                   `json:"inputError,omitempty"`
	KCMError         string                   `json:"kcmError,omitempty"`
	Error            string                   `json:"error,omitempty"`
	InlineVolumeSpec *v1.PersistentVolumeSpec `json:"inlineVolumeSpec,omitempty"`
	Volume           *volume                  `json:"volume,omitempty"`
	Repair           *repair                  `json:"repair,omitempty"`
}

var translator = csitrans.New()

func main() {
	logger := klog.Background()
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	out := bufio.NewWriterSize(os.Stdout, 1<<20)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 && !(len(line) == 1 && line[0] == '\n') {
			if encErr := enc.Encode(handle(logger, line)); encErr != nil {
				fmt.Fprintf(os.Stderr, "translation-oracle: %v\n", encErr)
				os.Exit(1)
			}
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "translation-oracle: reading stdin: %v\n", err)
			os.Exit(1)
		}
		// One answer per question, without waiting for the buffer to fill:
		// a caller may write and read in lock-step.
		if in.Buffered() == 0 {
			if err := out.Flush(); err != nil {
				fmt.Fprintf(os.Stderr, "translation-oracle: %v\n", err)
				os.Exit(1)
			}
		}
	}
}

func handle(logger klog.Logger, line []byte) output {
	var req input
	// Case-sensitive field names, as client-go decodes API objects.
	if err := kjson.Unmarshal(line, &req); err != nil {
		return output{InputError: err.Error()}
	}
	res := output{Case: req.Case}
	var spec *v1.PersistentVolumeSpec
	var migrated, reconcileMigratable bool
	switch {
	case req.PV != nil:
		pv := req.PV
		if translator.IsPVMigratable(pv) {
			translated, err := translator.TranslateInTreePVToCSI(logger, pv)
			if err != nil {
				res.Error = fmt.Sprintf("failed to translate in tree pv to CSI: %v", err)
				return res
			}
			pv = translated
			migrated = true
			reconcileMigratable = true
		}
		if pv.Spec.CSI == nil {
			res.Error = "pv spec contained non-csi source that was not migrated"
			return res
		}
		spec = &pv.Spec
	case req.InlineVolumeSpec != nil || req.PodVolume != nil:
		spec = req.InlineVolumeSpec
		if req.PodVolume != nil {
			pv, err := translateInline(logger, req.PodVolume, req.PodNamespace)
			if err != nil {
				res.KCMError = err.Error()
				return res
			}
			spec = &pv.Spec
			res.InlineVolumeSpec = spec
		}
		if spec.CSI == nil {
			res.Error = "inline volume spec contains nil CSI source"
			return res
		}
		reconcileMigratable = true
	default:
		res.Error = "neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source"
		return res
	}

	csi := spec.CSI
	v := &volume{
		Driver:                     csi.Driver,
		VolumeHandle:               csi.VolumeHandle,
		ReadOnly:                   csi.ReadOnly,
		FSType:                     csi.FSType,
		VolumeAttributes:           map[string]string{},
		ControllerPublishSecretRef: ref(csi.ControllerPublishSecretRef),
		NodeStageSecretRef:         ref(csi.NodeStageSecretRef),
		NodePublishSecretRef:       ref(csi.NodePublishSecretRef),
		ControllerExpandSecretRef:  ref(csi.ControllerExpandSecretRef),
		NodeExpandSecretRef:        ref(csi.NodeExpandSecretRef),
		MountOptions:               spec.MountOptions,
		Migrated:                   migrated,
		ReconcileMigratable:        reconcileMigratable,
	}
	// nil and empty attributes are the same volume_context on the wire.
	for k, val := range csi.VolumeAttributes {
		v.VolumeAttributes[k] = val
	}
	if spec.AccessModes != nil {
		v.AccessModes = make([]string, 0, len(spec.AccessModes))
		for _, m := range spec.AccessModes {
			v.AccessModes = append(v.AccessModes, string(m))
		}
	}
	if spec.VolumeMode != nil {
		mode := string(*spec.VolumeMode)
		v.VolumeMode = &mode
	}
	res.Volume = v

	if req.NodeID != nil && reconcileMigratable {
		r := &repair{}
		h, err := translator.RepairVolumeHandle(csi.Driver, csi.VolumeHandle, *req.NodeID)
		if err != nil {
			r.Error = err.Error()
		} else {
			r.Handle = &h
		}
		res.Repair = r
	}
	return res
}

// translateInline is kube-controller-manager's TranslateInTreeInlineVolumeToCSI. A panic
// of the library becomes an error: csi-translation-lib v0.37.2 dereferences a nil source
// for a vSphere pod volume with a storagePolicyName (vsphere_volume.go), so no
// VolumeAttachment is ever made for it.
func translateInline(logger klog.Logger, vol *v1.Volume, podNamespace string) (pv *v1.PersistentVolume, err error) {
	defer func() {
		if r := recover(); r != nil {
			pv, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	return translator.TranslateInTreeInlineVolumeToCSI(logger, vol, podNamespace)
}

func ref(r *v1.SecretReference) *secretRef {
	if r == nil {
		return nil
	}
	return &secretRef{Name: r.Name, Namespace: r.Namespace}
}
