// Test tools only: the GCE Persistent Disk CSI driver, a vendor's real CSI
// driver. Its deploy/kubernetes manifests are the vendor Deployment the
// topology tests transform (tests/support locates them in the module cache).
module attacher.test/testbins/pd

go 1.26.0

require sigs.k8s.io/gcp-compute-persistent-disk-csi-driver v1.28.1
