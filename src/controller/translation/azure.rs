//! Azure Disk and Azure File (`azureDisk` -> `disk.csi.azure.com`, `azureFile` ->
//! `file.csi.azure.com`): the managed-disk rule and the storage account of a File share.

use k8s_openapi::api::core::v1::SecretReference;

use super::{error::TranslationError, plugin::Translation};
use crate::names::AZURE_FILE_RESOURCE_GROUP_ANNOTATION;

/// Azure Disk: refused unless `kind` is missing or `Managed` (any case); handle = `diskURI`;
/// attributes `kind`, `cachingmode` and `fstype` (also copied to fsType); readOnly copied.
pub(crate) fn translate_disk(t: &mut Translation<'_>) -> Result<(), TranslationError> {
    let src = t.spec.azure_disk.take().unwrap_or_default();
    // Go's strings.EqualFold; "managed" has no non-ASCII case-fold partners.
    if let Some(kind) = src
        .kind
        .filter(|k| !k.eq_ignore_ascii_case(AZURE_MANAGED_DISK))
    {
        return Err(TranslationError::AzureDiskKind(kind));
    }
    t.csi.volume_handle = src.disk_uri;
    t.csi.read_only = src.read_only;
    if let Some(mode) = src.caching_mode {
        t.attrs.insert("cachingmode".to_owned(), mode);
    }
    if let Some(fs) = src.fs_type {
        t.attrs.insert("fstype".to_owned(), fs.clone());
        t.csi.fs_type = Some(fs);
    }
    t.attrs
        .insert("kind".to_owned(), AZURE_MANAGED_DISK.to_owned());
    Ok(())
}

/// Azure File: handle `<rg>#<account>#<share>#<pv name>#<namespace>`; attribute `sharename`;
/// the node-stage secret is the in-tree secret in that namespace; readOnly copied.
pub(crate) fn translate_file(t: &mut Translation<'_>) -> Result<(), TranslationError> {
    let src = t.spec.azure_file.take().unwrap_or_default();
    let account = azure_storage_account(&src.secret_name).unwrap_or(&src.secret_name);
    let resource_group = t
        .annotation(AZURE_FILE_RESOURCE_GROUP_ANNOTATION)
        .unwrap_or("");
    // An explicit secretNamespace wins even when empty (and is then refused).
    let namespace = match &src.secret_namespace {
        Some(ns) => ns.clone(),
        None => t
            .spec
            .claim_ref
            .as_ref()
            .and_then(|c| c.namespace.clone())
            .unwrap_or_default(),
    };
    if namespace.is_empty() {
        return Err(TranslationError::AzureFileSecretNamespace);
    }
    let pv_name = t.pv.metadata.name.as_deref().unwrap_or_default();
    t.csi.volume_handle = format!(
        "{resource_group}#{account}#{}#{pv_name}#{namespace}",
        src.share_name
    );
    t.csi.read_only = src.read_only;
    t.attrs.insert("sharename".to_owned(), src.share_name);
    t.csi.node_stage_secret_ref = Some(SecretReference {
        name: Some(src.secret_name),
        namespace: Some(namespace),
    });
    Ok(())
}

/// Name of the Azure File secret that names a storage account: `azure-storage-account-<account>-secret`.
const AZURE_FILE_SECRET_PREFIX: &str = "azure-storage-account-";

/// See [`AZURE_FILE_SECRET_PREFIX`].
const AZURE_FILE_SECRET_SUFFIX: &str = "-secret";

/// The only Azure Disk `kind` csi-translation-lib migrates (compared case-insensitively); also
/// the value of the `kind` volume attribute it always sets.
const AZURE_MANAGED_DISK: &str = "Managed";

/// The storage account named by an Azure File secret, as csi-translation-lib's unanchored
/// regular expression `azure-storage-account-(.+)-secret` finds it: the leftmost
/// `azure-storage-account-` that a match starts at, and the longest account after it (up to
/// the last `-secret` before a newline, at least one character). `None` when nothing matches;
/// the library then uses the whole secret name.
fn azure_storage_account(secret_name: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(found) = secret_name[from..].find(AZURE_FILE_SECRET_PREFIX) {
        let start = from + found + AZURE_FILE_SECRET_PREFIX.len();
        let rest = &secret_name[start..];
        // `.` does not match a newline, so the account ends before the first one.
        let line_end = rest.find('\n').unwrap_or(rest.len());
        let last_suffix = rest[..(line_end + AZURE_FILE_SECRET_SUFFIX.len()).min(rest.len())]
            .rfind(AZURE_FILE_SECRET_SUFFIX);
        if let Some(end) = last_suffix.filter(|e| *e >= 1 && *e <= line_end) {
            return Some(&rest[..end]);
        }
        from = from + found + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::*;

    #[test]
    fn azure_disks_migrate_only_when_managed() {
        // The API server defaults a missing kind to Shared, which is refused.
        for kind in ["Shared", "Dedicated", "", "bogus"] {
            assert_eq!(
                translated(&azure_disk_pv(Some(kind), None)).map(|_| ()),
                Err(format!(
                    "{TRANSLATE}kind({kind}) is not supported in csi migration"
                )),
                "{kind}"
            );
        }
        for kind in [None, Some("Managed"), Some("managed"), Some("MANAGED")] {
            assert_eq!(
                attrs(&azure_disk_pv(kind, None)),
                map(&[("fstype", "ext4"), ("kind", "Managed")]),
                "{kind:?}"
            );
        }
        // Every caching mode is passed on, also an empty one.
        for caching in ["None", "ReadOnly", "ReadWrite", ""] {
            assert_eq!(
                attrs(&azure_disk_pv(None, Some(caching)))
                    .get("cachingmode")
                    .map(String::as_str),
                Some(caching)
            );
        }
    }

    #[test]
    fn azure_file_handles_name_the_pv_and_the_secret_namespace() {
        let file = |secret: &str, ns: Option<&str>| translated(&azure_file_pv(secret, ns));
        let csi = file("azure-storage-account-acct-secret", Some("ns")).expect("translates");
        assert_eq!(csi.volume_handle, "#acct#share#in-tree#ns");
        // The node-stage secret is the in-tree one, in the secret namespace.
        assert_eq!(
            csi.node_stage_secret_ref,
            Some(SecretReference {
                name: Some("azure-storage-account-acct-secret".into()),
                namespace: Some("ns".into()),
            })
        );
        // Without secretNamespace, the claim's namespace; an empty secretNamespace is refused.
        let claimed = with_claim_namespace(azure_file_pv("mysecret", None), "claim-ns");
        let csi = translated(&annotated_pv(
            claimed,
            "kubernetes.io/azure-file-resource-group",
            "rg",
        ))
        .expect("translates");
        assert_eq!(csi.volume_handle, "rg#mysecret#share#in-tree#claim-ns");
        assert_eq!(
            csi.node_stage_secret_ref.and_then(|s| s.name).as_deref(),
            Some("mysecret")
        );
        let refused = Err(format!(
            "{TRANSLATE}could not find a secret namespace in PersistentVolumeSource or ClaimRef"
        ));
        assert_eq!(file("mysecret", None).map(|_| ()), refused);
        let explicit_empty = with_claim_namespace(azure_file_pv("mysecret", Some("")), "claim-ns");
        assert_eq!(translated(&explicit_empty).map(|_| ()), refused);
    }

    #[test]
    fn azure_file_accounts_follow_the_library_regular_expression() {
        let cases = [
            ("azure-storage-account-acct-secret", Some("acct")),
            ("xazure-storage-account-acct-secretx", Some("acct")),
            (
                "azure-storage-account-a-secret-b-secret",
                Some("a-secret-b"),
            ),
            ("azure-storage-account---secret", Some("-")),
            ("azure-storage-account--secret", None),
            ("azure-storage-account-acct", None),
            (
                "azure-storage-account-azure-storage-account-x-secret",
                Some("azure-storage-account-x"),
            ),
            // `.` does not match a newline.
            ("azure-storage-account-a\nb-secret", None),
            ("azure-storage-account-a-secret\n-secret", Some("a")),
            (
                "azure-storage-account-\nazure-storage-account-b-secret",
                Some("b"),
            ),
            ("mysecret", None),
        ];
        for (secret, want) in cases {
            assert_eq!(azure_storage_account(secret), want, "{secret:?}");
        }
    }
}
