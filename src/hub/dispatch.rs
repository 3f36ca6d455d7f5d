//! `Dispatch`: routes watch events to drivers: a VA to the driver named by `spec.attacher`, a
//! PV to every driver holding a finalizer on it (also when another driver's VA naming it is
//! deleted).

use std::sync::{Arc, OnceLock};

use super::registry::Registry;
use crate::k8s::{
    lean::{Pv, Va},
    router::Route,
    stores::Store,
};

/// Routes watch events to drivers.
pub(crate) struct Dispatch {
    /// The drivers.
    pub(crate) registry: Arc<Registry>,
    /// The PV cache, set once the router has made it (before any event).
    pub(crate) pvs: OnceLock<Store<Pv>>,
}

/// The drivers, by sanitized name, that hold an attacher finalizer on `pv`.
fn finalizer_holders(pv: &Pv) -> impl Iterator<Item = &str> {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .filter_map(|f| f.strip_prefix(crate::names::FINALIZER_PREFIX))
}

/// The drivers, by sanitized name, to be told about `pv` when a VA naming it
/// is deleted, besides the VA's own driver (`attacher`, which always is).
///
/// Every attacher puts the PV of *any* deleted VA on its PV queue, whatever
/// the VA's driver, because that VA may have been the last one keeping the
/// attacher's finalizer on the PV (`docs/design.md#pv-finalizer`). Only an attacher holding a
/// finalizer on the PV can have anything to do, so only those are told. A
/// deletion is the only VA event that can release a finalizer: a VA's spec
/// (and so the PV it names) is immutable, and an added VA only keeps one.
fn holders_to_tell<'a>(attacher: &str, pv: &'a Pv) -> Vec<&'a str> {
    let own = crate::names::sanitize_driver_name(attacher);
    let mut holders: Vec<&str> = finalizer_holders(pv).filter(|s| *s != own).collect();
    holders.dedup();
    holders
}

impl Route for Dispatch {
    fn va_applied(&self, old: Option<&Va>, new: &Va) {
        if let Some(driver) = self.registry.get(&new.spec.attacher) {
            driver.on_va(old, new);
        }
    }

    fn va_deleted(&self, va: &Va) {
        if let Some(driver) = self.registry.get(&va.spec.attacher) {
            driver.on_va_deleted(va);
        }
        let Some(pv) = va
            .spec
            .source
            .persistent_volume_name
            .as_deref()
            .and_then(|name| self.pvs.get()?.get(name))
        else {
            return;
        };
        for sanitized in holders_to_tell(&va.spec.attacher, &pv) {
            if let Some((name, driver)) = self.registry.by_sanitized(sanitized) {
                driver.on_pv(&name, &pv);
            }
        }
    }

    fn pv_applied(&self, pv: &Pv) {
        if let Some(name) = pv.metadata.name.as_deref() {
            self.registry.each_slot(|driver| driver.on_pv_arrived(name));
        }
        for sanitized in finalizer_holders(pv) {
            if let Some((name, driver)) = self.registry.by_sanitized(sanitized) {
                driver.on_pv(&name, pv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::lean::Meta;

    fn pv(finalizers: &[&str]) -> Pv {
        Pv {
            metadata: Meta {
                name: Some("pv".into()),
                finalizers: Some(finalizers.iter().map(|f| (*f).to_string()).collect()),
                ..Meta::default()
            },
            ..Pv::default()
        }
    }

    #[test]
    fn a_deleted_va_tells_every_other_driver_holding_a_finalizer_on_its_pv() {
        let shared = pv(&[
            "kubernetes.io/pv-protection",
            "external-attacher/a-csi-io",
            "external-attacher/b-csi-io",
            "example.com/other",
        ]);
        // The VA's own driver is told anyway (on_va_deleted): not twice.
        assert_eq!(holders_to_tell("a.csi.io", &shared), ["b-csi-io"]);
        assert_eq!(holders_to_tell("b.csi.io", &shared), ["a-csi-io"]);
        // A VA of a driver holding nothing on the PV still releases the others.
        assert_eq!(
            holders_to_tell("c.csi.io", &shared),
            ["a-csi-io", "b-csi-io"]
        );
        // No attacher finalizer: nobody to tell.
        assert!(holders_to_tell("c.csi.io", &pv(&["kubernetes.io/pv-protection"])).is_empty());
        assert!(holders_to_tell("c.csi.io", &Pv::default()).is_empty());
    }

    #[test]
    fn finalizer_holders_are_the_sanitized_driver_names() {
        let p = pv(&[
            "external-attacher/x-y-zX",
            "external-attacherx/no",
            "external-attacher/",
        ]);
        assert_eq!(finalizer_holders(&p).collect::<Vec<_>>(), ["x-y-zX", ""]);
    }
}
