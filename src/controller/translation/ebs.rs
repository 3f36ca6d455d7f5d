//! AWS EBS (`awsElasticBlockStore` -> `ebs.csi.aws.com`): volume IDs, with `aws://` URLs parsed
//! as Go's `net/url` parses them.

use super::error::TranslationError;
use super::go_url;
use super::plugin::Translation;

/// AWS EBS: the handle from [`ebs_volume_id`]; attribute `partition` always (`"0"` for 0);
/// readOnly and fsType copied.
pub(crate) fn translate(t: &mut Translation<'_>) -> Result<(), TranslationError> {
    let src = t.spec.aws_elastic_block_store.take().unwrap_or_default();
    t.csi.volume_handle = ebs_volume_id(&src.volume_id)?;
    t.csi.read_only = src.read_only;
    t.csi.fs_type = src.fs_type;
    // Unlike GCE PD, a zero partition is formatted too: "0".
    t.attrs.insert(
        "partition".to_owned(),
        src.partition.unwrap_or(0).to_string(),
    );
    Ok(())
}

/// The EBS volume ID of an in-tree `volumeID` (csi-translation-lib
/// `KubernetesVolumeIDToEBSVolumeID`): an ID not starting with `aws://` is kept as it is
/// (even empty or malformed); otherwise it is parsed as a URL the way Go's `net/url.Parse`
/// does, and the path, `/` trimmed on both sides, must be `vol-` followed by anything but `/`.
fn ebs_volume_id(id: &str) -> Result<String, TranslationError> {
    if !id.starts_with("aws://") {
        return Ok(id.to_owned());
    }
    let path = go_url::parse_path(id)
        .map_err(|e| TranslationError::EbsVolumeId(format!("Invalid disk name ({id}): {e}")))?;
    let volume = path.trim_matches('/');
    if volume.starts_with("vol-") && !volume.contains('/') {
        Ok(volume.to_owned())
    } else {
        Err(TranslationError::EbsVolumeId(format!(
            "Invalid format for AWS volume ({id})"
        )))
    }
}

#[cfg(test)]
mod tests {
    use crate::controller::fixtures::*;

    #[test]
    fn ebs_volume_ids_are_parsed_as_go_parses_urls() {
        let handle = |id: &str| translated(&ebs_pv(id, None)).map(|c| c.volume_handle);
        let ok = |h: &str| Ok(h.to_owned());
        let invalid = |id: &str| {
            Err(format!(
                "{TRANSLATE}failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume ({id})"
            ))
        };
        let bad_url = |id: &str, url: &str, reason: &str| {
            Err(format!(
                "{TRANSLATE}failed to translate Kubernetes ID to EBS Volume ID Invalid disk name ({id}): parse \"{url}\": {reason}"
            ))
        };
        // Without the (case-sensitive) `aws://` prefix the ID is kept, even when malformed.
        assert_eq!(handle("vol-0123"), ok("vol-0123"));
        assert_eq!(handle(""), ok(""));
        assert_eq!(handle("AWS://z/vol-1"), ok("AWS://z/vol-1"));
        assert_eq!(handle("aws:/z/vol-1"), ok("aws:/z/vol-1"));
        // The path is decoded and trimmed of `/`; query and fragment are dropped.
        assert_eq!(handle("aws://us-east-1a/vol-0123"), ok("vol-0123"));
        assert_eq!(handle("aws:///vol-0123"), ok("vol-0123"));
        assert_eq!(handle("aws://z//vol-1//"), ok("vol-1"));
        assert_eq!(handle("aws://z/vol-%41b"), ok("vol-Ab"));
        assert_eq!(handle("aws://z/vol-%E6%97%A5"), ok("vol-日"));
        assert_eq!(handle("aws://z/vol-1?x=1#f"), ok("vol-1"));
        assert_eq!(handle("aws://user:pw@z:80/vol-1"), ok("vol-1"));
        assert_eq!(handle("aws://[fe80::1%25eth0]:80/vol-1"), ok("vol-1"));
        // The path must be one `vol-` segment.
        assert_eq!(handle("aws://vol-0123"), invalid("aws://vol-0123"));
        assert_eq!(handle("aws://z/x/vol-1"), invalid("aws://z/x/vol-1"));
        assert_eq!(handle("aws://z/vol-a%2Fb"), invalid("aws://z/vol-a%2Fb"));
        // URL errors carry Go's texts (the URL as Go quotes it, the reason).
        for (id, url, reason) in [
            (
                "aws://us east/vol-1",
                None,
                "invalid character \" \" in host name",
            ),
            ("aws://z/vol-%zz", None, "invalid URL escape \"%zz\""),
            (
                "aws://z/vol-1\t",
                Some("aws://z/vol-1\\t"),
                "net/url: invalid control character in URL",
            ),
            // The fragment is checked last, and the error then names the whole ID.
            ("aws://z/vol-1#%zz", None, "invalid URL escape \"%zz\""),
            ("aws://%41/vol-1", None, "invalid URL escape \"%41\""),
            ("aws://z:x/vol-1", None, "invalid port \":x\" after host"),
            ("aws://u|s@z/vol-1", None, "net/url: invalid userinfo"),
            ("aws://[10.0.0.1]/vol-1", None, "invalid IP-literal"),
            ("aws://[::1/vol-1", None, "missing ']' in host"),
            (
                "aws://[1::2::3]/vol-1",
                None,
                "invalid host: ParseAddr(\"1::2::3\"): multiple :: in address (at \":3\")",
            ),
        ] {
            assert_eq!(handle(id), bad_url(id, url.unwrap_or(id), reason), "{id}");
        }
    }
}
