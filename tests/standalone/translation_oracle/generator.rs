//! Seeded generator of translation cases: in-tree PVs of the seven migratable plugins (and
//! some that are not migratable), VolumeAttachment inline specs, and pod inline volumes, as
//! the JSON the API server would hand an informer, with the edge values csi-translation-lib
//! reads. Every case is a pure function of `(seed, index)`, so one case can be regenerated
//! alone.

use serde_json::{Map, Value, json};

/// SplitMix64: small, fast, and good enough to pick test values.
pub(crate) struct Rng(u64);

impl Rng {
    /// The generator of case `index` under `seed`.
    pub(crate) fn for_case(seed: u64, index: u64) -> Rng {
        let mut rng = Rng(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        rng.next();
        rng
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `num / den`.
    fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// What a case feeds the translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// A PV of one in-tree plugin (index into [`PLUGINS`]).
    InTreePv(usize),
    /// A PV that is not in-tree: CSI, NFS, empty, no spec.
    OtherPv,
    /// A VolumeAttachment's `inlineVolumeSpec`.
    InlineSpec,
    /// A pod volume, translated by kube-controller-manager first (index into [`PLUGINS`]).
    PodVolume(usize),
}

/// The in-tree sources csi-translation-lib migrates (PV field names).
pub(crate) const PLUGINS: [&str; 7] = [
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cinder",
    "vsphereVolume",
    "portworxVolume",
];

const GA_ZONE: &str = "topology.kubernetes.io/zone";
const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";

/// One case: `{"case": "<seed>:<index>", "pv" | "inlineVolumeSpec" | "podVolume": ...}`.
pub(crate) fn case(seed: u64, index: u64) -> (Kind, Value) {
    let mut rng = Rng::for_case(seed, index);
    let mut line = Map::new();
    line.insert("case".into(), json!(format!("{seed}:{index}")));
    let roll = rng.below(100);
    let kind = if roll < 80 {
        let plugin = rng.below(PLUGINS.len());
        line.insert("pv".into(), in_tree_pv(&mut rng, plugin));
        Kind::InTreePv(plugin)
    } else if roll < 86 {
        line.insert("pv".into(), other_pv(&mut rng));
        Kind::OtherPv
    } else if roll < 93 {
        line.insert("inlineVolumeSpec".into(), inline_spec(&mut rng));
        Kind::InlineSpec
    } else {
        let plugin = rng.below(PLUGINS.len());
        line.insert("podVolume".into(), pod_volume(&mut rng, plugin));
        if let Some(ns) = maybe(&mut rng, &["", "ns-1", "kube-system"]) {
            line.insert("podNamespace".into(), json!(ns));
        }
        Kind::PodVolume(plugin)
    };
    if let Some(node) = maybe(&mut rng, NODE_IDS) {
        line.insert("nodeID".into(), json!(node));
    }
    (kind, Value::Object(line))
}

/// `None` (field absent) one time in `items.len() + 1`, else one of `items`.
fn maybe<T: Clone>(rng: &mut Rng, items: &[T]) -> Option<T> {
    let i = rng.below(items.len() + 1);
    items.get(i).cloned()
}

/// Inserts `key: value` when `value` is `Some`.
fn put(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(v) = value {
        map.insert(key.into(), v);
    }
}

const NODE_IDS: &[&str] = &[
    "projects/p1/zones/us-central1-c/instances/n1",
    "projects/p2/zones/europe-west1-b/instances/n2/extra",
    "projects/p1/zones/bad-zone/instances/n1",
    "projects/p1/zones/a-b-c-d/instances/n1",
    "a/b/c/d/e",
    "node-1",
    "",
];

const FS_TYPES: &[&str] = &["", "ext4", "xfs", "ntfs"];
const PARTITIONS: &[i64] = &[0, 0, 1, 3, 15, -1, 2_147_483_647, -2_147_483_648];
const BOOLS: &[bool] = &[false, true];

/// Zone label values: zonal, regional (`__`), empty parts, malformed zones.
const ZONES: &[&str] = &[
    "us-central1-a",
    "us-central1-b",
    "europe-west1-b",
    "us-east-1a",
    "",
    "zone",
    "us-central1",
    "a-b-c-d",
    "us-central1-a__us-central1-b",
    "us-central1-a__europe-west1-b",
    "us-central1-a__us-central1-b__us-central1-c",
    "us-central1-a__us-central1-a",
    "us-central1-a__",
    "__us-central1-a",
    "__",
    "a-b-c__a-b-d",
    "a-b-c__a-b",
    "x__y__z",
    "us-central1-a___us-central1-b",
    " us-central1-a",
    "日本-東京-a",
];

fn zone(rng: &mut Rng) -> String {
    if rng.chance(1, 4) {
        // A fresh regional list: two or three zones of one or two regions.
        let n = 2 + rng.below(2);
        let parts: Vec<&str> = (0..n)
            .map(|_| {
                rng.pick(&[
                    "us-central1-a",
                    "us-central1-f",
                    "europe-west1-b",
                    "asia-x-y",
                ])
            })
            .collect();
        parts.join("__")
    } else {
        rng.pick(ZONES).to_owned()
    }
}

/// Metadata shared by every PV: name, beta / GA / both (agreeing or not) zone labels, region
/// labels, and the annotations some plugins read.
fn metadata(rng: &mut Rng) -> Value {
    let mut meta = Map::new();
    put(
        &mut meta,
        "name",
        maybe(rng, &["pv-1", "pvc-0a1b2c3d", "", "p.v"]).map(|n| json!(n)),
    );
    let mut labels = Map::new();
    match rng.below(6) {
        0 => {}
        1 => {
            labels.insert(GA_ZONE.into(), json!(zone(rng)));
        }
        2 => {
            labels.insert(BETA_ZONE.into(), json!(zone(rng)));
        }
        3 => {
            // Both, agreeing.
            let z = zone(rng);
            labels.insert(GA_ZONE.into(), json!(z));
            labels.insert(BETA_ZONE.into(), json!(z));
        }
        _ => {
            // Both, independently (mostly disagreeing).
            labels.insert(GA_ZONE.into(), json!(zone(rng)));
            labels.insert(BETA_ZONE.into(), json!(zone(rng)));
        }
    }
    if rng.chance(1, 5) {
        labels.insert(
            rng.pick(&[
                "topology.kubernetes.io/region",
                "failure-domain.beta.kubernetes.io/region",
            ])
            .into(),
            json!(rng.pick(&["us-central1", "", "eu"])),
        );
    }
    if !labels.is_empty() || rng.chance(1, 8) {
        meta.insert("labels".into(), Value::Object(labels));
    }
    let mut annotations = Map::new();
    for (key, values) in [
        (
            "kubernetes.io/azure-file-resource-group",
            &["", "rg-1", "rg#2"][..],
        ),
        ("openstorage.io/auth-secret-name", &["", "px-secret"][..]),
        ("openstorage.io/auth-secret-namespace", &["", "px-ns"][..]),
        (
            "pv.kubernetes.io/migrated-to",
            &["pd.csi.storage.gke.io", "other"][..],
        ),
    ] {
        if rng.chance(1, 3) {
            annotations.insert(key.into(), json!(rng.pick(values)));
        }
    }
    if !annotations.is_empty() || rng.chance(1, 8) {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Value::Object(meta)
}

/// Spec fields beside the source that the attacher reads or the library touches.
fn common_spec(rng: &mut Rng, spec: &mut Map<String, Value>) {
    const MODES: &[&str] = &[
        "ReadWriteOnce",
        "ReadOnlyMany",
        "ReadWriteMany",
        "ReadWriteOncePod",
    ];
    if !rng.chance(1, 6) {
        let n = rng.below(4);
        let modes: Vec<&str> = (0..n).map(|_| rng.pick(MODES)).collect();
        spec.insert("accessModes".into(), json!(modes));
    }
    put(
        spec,
        "volumeMode",
        maybe(rng, &["Filesystem", "Block"]).map(|m| json!(m)),
    );
    if rng.chance(1, 4) {
        let opts: &[&str] = rng.pick(&[&[][..], &["ro"][..], &["noatime", "discard"][..]]);
        spec.insert("mountOptions".into(), json!(opts));
    }
    if rng.chance(1, 4) {
        let n = rng.below(3);
        let claim = match n {
            0 => json!({"name": "claim", "namespace": "claim-ns"}),
            1 => json!({"name": "claim"}),
            _ => json!({"name": "claim", "namespace": ""}),
        };
        spec.insert("claimRef".into(), claim);
    }
    if rng.chance(1, 5) {
        let key = rng.pick(&[GA_ZONE, BETA_ZONE, "topology.gke.io/zone", "other"]);
        spec.insert(
            "nodeAffinity".into(),
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": key, "operator": "In", "values": [rng.pick(&["us-central1-a", "z"])]}
            ]}]}}),
        );
    }
    if rng.chance(1, 20) {
        // In-tree and CSI at once (the API server refuses it; the library translates anyway).
        spec.insert("csi".into(), csi_source(rng));
    }
    if rng.chance(1, 10) {
        spec.insert("capacity".into(), json!({"storage": "1Gi"}));
        spec.insert("persistentVolumeReclaimPolicy".into(), json!("Retain"));
    }
}

/// An in-tree PV of `PLUGINS[plugin]`.
fn in_tree_pv(rng: &mut Rng, plugin: usize) -> Value {
    let mut spec = Map::new();
    common_spec(rng, &mut spec);
    spec.insert(PLUGINS[plugin].into(), source(rng, plugin, true));
    let mut pv = Map::new();
    if !rng.chance(1, 30) {
        pv.insert("metadata".into(), metadata(rng));
    }
    pv.insert("spec".into(), Value::Object(spec));
    Value::Object(pv)
}

/// The in-tree source of `PLUGINS[plugin]`: for a PV (`pv`) or a pod volume.
fn source(rng: &mut Rng, plugin: usize, pv: bool) -> Value {
    let mut s = Map::new();
    let fs_type = maybe(rng, FS_TYPES).map(|f| json!(f));
    let read_only = maybe(rng, BOOLS).map(|b| json!(b));
    match PLUGINS[plugin] {
        "gcePersistentDisk" => {
            s.insert(
                "pdName".into(),
                json!(rng.pick(&["disk-1", "", "pd-日本", "a/b", "UNSPECIFIED"])),
            );
            put(&mut s, "fsType", fs_type);
            put(
                &mut s,
                "partition",
                maybe(rng, PARTITIONS).map(|p| json!(p)),
            );
            put(&mut s, "readOnly", read_only);
        }
        "awsElasticBlockStore" => {
            s.insert("volumeID".into(), json!(ebs_volume_id(rng)));
            put(&mut s, "fsType", fs_type);
            put(
                &mut s,
                "partition",
                maybe(rng, PARTITIONS).map(|p| json!(p)),
            );
            put(&mut s, "readOnly", read_only);
        }
        "azureDisk" => {
            s.insert("diskName".into(), json!(rng.pick(&["disk-1", ""])));
            s.insert("diskURI".into(), json!(rng.pick(AZURE_DISK_URIS)));
            let mut caching = maybe(rng, &["None", "ReadOnly", "ReadWrite", "", "readwrite"]);
            let mut kind = maybe(
                rng,
                &[
                    "Managed",
                    "managed",
                    "MANAGED",
                    "Shared",
                    "Dedicated",
                    "",
                    "bogus",
                ],
            );
            let mut fs_type = fs_type;
            let mut read_only = read_only;
            if rng.chance(1, 3) {
                // What the API server's defaulting (SetObjectDefaults_PersistentVolume) fills in.
                caching.get_or_insert("ReadWrite");
                kind.get_or_insert("Shared");
                fs_type.get_or_insert(json!("ext4"));
                read_only.get_or_insert(json!(false));
            }
            put(&mut s, "cachingMode", caching.map(|c| json!(c)));
            put(&mut s, "kind", kind.map(|k| json!(k)));
            put(&mut s, "fsType", fs_type);
            put(&mut s, "readOnly", read_only);
        }
        "azureFile" => {
            s.insert("secretName".into(), json!(rng.pick(AZURE_FILE_SECRETS)));
            s.insert("shareName".into(), json!(rng.pick(&["share", "", "a#b"])));
            if pv {
                put(
                    &mut s,
                    "secretNamespace",
                    maybe(rng, &["", "ns-1", "kube-system"]).map(|n| json!(n)),
                );
            }
            put(&mut s, "readOnly", read_only);
        }
        "cinder" => {
            s.insert("volumeID".into(), json!(rng.pick(&["c-1", ""])));
            put(&mut s, "fsType", fs_type);
            put(&mut s, "readOnly", read_only);
            if rng.chance(1, 3) {
                let secret = if pv {
                    json!({"name": "cinder-secret", "namespace": "ns-1"})
                } else {
                    json!({"name": "cinder-secret"})
                };
                s.insert("secretRef".into(), secret);
            }
        }
        "vsphereVolume" => {
            s.insert(
                "volumePath".into(),
                json!(rng.pick(&["[ds] kubevols/v.vmdk", "", "[ds] a b/日本.vmdk"])),
            );
            put(&mut s, "fsType", fs_type);
            put(
                &mut s,
                "storagePolicyName",
                maybe(rng, &["", "gold"]).map(|p| json!(p)),
            );
            put(
                &mut s,
                "storagePolicyID",
                maybe(rng, &["", "policy-1"]).map(|p| json!(p)),
            );
        }
        "portworxVolume" => {
            s.insert("volumeID".into(), json!(rng.pick(&["px-1", ""])));
            put(&mut s, "fsType", fs_type);
            put(&mut s, "readOnly", read_only);
        }
        other => unreachable!("plugin {other}"),
    }
    Value::Object(s)
}

const AZURE_DISK_URIS: &[&str] = &[
    "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Compute/disks/disk-1",
    "/subscriptions/sub-1/resourcegroups/rg-1/providers/microsoft.compute/disks/disk-1",
    "https://account.blob.core.windows.net/vhds/disk-1.vhd",
    "http://account.blob.core.windows.net/vhds/disk-1.vhd",
    "HTTPS://account/vhds/disk-1.vhd",
    "https://account.blob.core.windows.net/container/disk-1.vhd",
    "not-a-uri",
    "",
];

const AZURE_FILE_SECRETS: &[&str] = &[
    "azure-storage-account-acct-secret",
    "azure-storage-account-acct-secret",
    "azure-storage-account--secret",
    "azure-storage-account---secret",
    "azure-storage-account-a-secret-b-secret",
    "xazure-storage-account-acct-secretx",
    "azure-storage-account-acct",
    "azure-storage-account-azure-storage-account-x-secret",
    "azure-storage-account-a\nb-secret",
    "azure-storage-account-\nazure-storage-account-b-secret",
    "azure-storage-account-a-secret\n-secret",
    "azure-storage-account-日本-secret",
    "mysecret",
    "",
];

/// EBS volume IDs: every accepted form, and malformed ones, fixed and composed at random.
fn ebs_volume_id(rng: &mut Rng) -> String {
    const FIXED: &[&str] = &[
        "vol-0123456789abcdef0",
        "vol-",
        "vol-a/b",
        "",
        "i-0123",
        "aws://us-east-1a/vol-0123",
        "aws:///vol-0123",
        "aws://us-east-1a/vol-0123/",
        "aws://us-east-1a//vol-0123//",
        "aws://vol-0123",
        "aws://us-east-1a/",
        "aws://us-east-1a/x/vol-1",
        "aws://us-east-1a/vol-1?x=1",
        "aws://us-east-1a/vol-1?",
        "aws://us-east-1a/vol-1??",
        "aws://us-east-1a?/vol-1",
        "aws://us-east-1a/vol-1#frag",
        "aws://us-east-1a/vol-1#%zz",
        "aws://us-east-1a/vol-%41b",
        "aws://us-east-1a/vol-a%2Fb",
        "aws://us-east-1a/vol-%zz",
        "aws://us-east-1a/vol-%4",
        "aws://us-east-1a/vol-1%",
        "aws://us east/vol-1",
        "aws://user:pw@us-east-1a/vol-1",
        "aws://us|er@z/vol-1",
        "aws://u%zz@z/vol-1",
        "aws://z:80/vol-1",
        "aws://z:x/vol-1",
        "aws://z:1:2/vol-1",
        "aws://[::1]/vol-1",
        "aws://[fe80::1%25eth0]/vol-1",
        "aws://[10.0.0.1]/vol-1",
        "aws://[::1/vol-1",
        "aws://x[::1]/vol-1",
        "aws://[::1]:80/vol-1",
        "aws://[::1]x/vol-1",
        "aws://[nothex]/vol-1",
        "aws://[]/vol-1",
        "aws://%41/vol-1",
        "aws://%C3%A9/vol-1",
        "aws://z/vol-1\t",
        "aws://z/vol-\u{7f}",
        "aws://z/vol-日本",
        "aws://z/vol-%E6%97%A5",
        "aws://z/vol-%FF",
        "AWS://z/vol-1",
        "aws:/z/vol-1",
    ];
    const PIECES: &[&str] = &[
        "z",
        "us-east-1a",
        "/",
        "//",
        "vol-",
        "vol-1",
        "vol-1",
        "?",
        "#",
        "%",
        "%41",
        "%2F",
        "%25",
        "%zz",
        "%4",
        "%e6",
        "@",
        "u:p@",
        ":",
        ":80",
        ":x",
        "[",
        "]",
        "[::1]",
        "[::ffff:1.2.3.4]",
        "[1.2.3.4]",
        "[::1%25lo]",
        "[fe80::1%25%41]",
        "[1:2:3:4:5:6:7:8]",
        "[1::2::3]",
        "[12345::]",
        "[::1.2.3.4.5]",
        "[1:2:3:4:5:6:1.2.3.4]",
        "[01.2.3.4]",
        " ",
        "\t",
        "\n",
        "\u{7f}",
        "é",
        "日",
        "|",
        "^",
        "{",
        "<",
        "\"",
        "\\",
        "::",
        "1.2.3",
        ".",
        "0",
        "ff",
        "%",
        "\u{a0}",
        "\u{85}",
    ];
    if rng.chance(1, 2) {
        return rng.pick(FIXED).to_owned();
    }
    let mut id = String::from("aws://");
    for _ in 0..rng.below(7) {
        id.push_str(rng.pick(PIECES));
    }
    if rng.chance(1, 2) {
        id.push_str("/vol-1");
    }
    id
}

/// A PV that is not in-tree.
fn other_pv(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => json!({"metadata": {"name": "no-spec"}}),
        1 => json!({"metadata": {"name": "empty"}, "spec": {}}),
        2 => json!({"metadata": {"name": "nfs"}, "spec": {"nfs": {"server": "s", "path": "/p"}}}),
        _ => {
            let mut spec = Map::new();
            common_spec(rng, &mut spec);
            spec.insert("csi".into(), csi_source(rng));
            json!({"metadata": metadata(rng), "spec": spec})
        }
    }
}

/// A VolumeAttachment inline spec: usually CSI (of a migration driver or not), sometimes
/// without CSI source (maybe with an in-tree one, which the attacher never translates).
fn inline_spec(rng: &mut Rng) -> Value {
    let mut spec = Map::new();
    common_spec(rng, &mut spec);
    if rng.chance(1, 5) {
        spec.remove("csi");
        if rng.chance(1, 2) {
            let plugin = rng.below(PLUGINS.len());
            spec.insert(PLUGINS[plugin].into(), source(rng, plugin, true));
        }
    } else {
        spec.insert("csi".into(), csi_source(rng));
    }
    Value::Object(spec)
}

/// A CSI source with edge values, handles of every migration driver included.
fn csi_source(rng: &mut Rng) -> Value {
    let mut csi = Map::new();
    csi.insert(
        "driver".into(),
        json!(rng.pick(&[
            "pd.csi.storage.gke.io",
            "pd.csi.storage.gke.io",
            "ebs.csi.aws.com",
            "disk.csi.azure.com",
            "file.csi.azure.com",
            "cinder.csi.openstack.org",
            "csi.vsphere.vmware.com",
            "pxd.portworx.com",
            "hostpath.csi.k8s.io",
            "",
        ])),
    );
    csi.insert(
        "volumeHandle".into(),
        json!(rng.pick(&[
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
            "projects/UNSPECIFIED/zones/us-central1-a/disks/d",
            "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
            "projects/UNSPECIFIED/regions/us-central1/disks/d",
            "projects/p0/zones/z/disks/d",
            "projects/UNSPECIFIED/other/x/disks/d",
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d/extra",
            "projects/UNSPECIFIED/zones",
            "vol-1",
            "",
        ])),
    );
    put(&mut csi, "readOnly", maybe(rng, BOOLS).map(|b| json!(b)));
    put(&mut csi, "fsType", maybe(rng, FS_TYPES).map(|f| json!(f)));
    if rng.chance(1, 2) {
        let attrs = rng.pick(&[
            json!({}),
            json!({"partition": ""}),
            json!({"kind": "Managed", "cachingmode": "None"}),
        ]);
        csi.insert("volumeAttributes".into(), attrs);
    }
    for key in [
        "controllerPublishSecretRef",
        "nodeStageSecretRef",
        "nodePublishSecretRef",
        "controllerExpandSecretRef",
        "nodeExpandSecretRef",
    ] {
        if rng.chance(1, 4) {
            let secret = rng.pick(&[
                json!({}),
                json!({"name": "s"}),
                json!({"name": "s", "namespace": "ns"}),
            ]);
            csi.insert(key.into(), secret);
        }
    }
    Value::Object(csi)
}

/// A pod volume of `PLUGINS[plugin]`, for kube-controller-manager's inline translation.
fn pod_volume(rng: &mut Rng, plugin: usize) -> Value {
    let name = rng.pick(&["vol", "", "data-1"]);
    json!({"name": name, PLUGINS[plugin]: source(rng, plugin, false)})
}
