//! [`Registry`]: every configured driver slot, and the drivers by the name they report and by
//! sanitized name (finalizer and Lease names), so that two sockets never serve one name.

use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::{Mutex, RwLock};

use super::driver::{Driver, context::Names};

/// Drivers by the name they report, and by sanitized name (finalizer and
/// Lease names).
#[derive(Debug, Default)]
pub struct Registry {
    by_name: DashMap<String, Arc<Driver>>,
    by_sanitized: DashMap<String, String>,
    /// Held while a name is claimed or released, so that two sockets reporting one name at the
    /// same moment cannot both pass the checks before either inserts (readers never take it).
    claims: Mutex<()>,
    /// Every configured slot, named or not, in configuration order.
    slots: RwLock<Vec<Arc<Driver>>>,
    /// Names of removed slots whose metric series are still to be removed.
    retired: Mutex<Vec<String>>,
    /// Bumped when a slot is added or removed.
    slots_changed: tokio::sync::watch::Sender<u64>,
}

impl Registry {
    /// Claims `name` for `driver`. Refused when another socket already serves
    /// the name, or when another name sanitizes to the same finalizer/Lease.
    pub fn register(&self, name: &str, driver: &Arc<Driver>) -> Result<(), String> {
        let _claim = self.claims.lock();
        let sanitized = crate::names::sanitize_driver_name(name);
        if let Some(existing) = self.by_name.get(name)
            && !Arc::ptr_eq(existing.value(), driver)
        {
            return Err(format!(
                "driver name {name:?} is already served by socket {}; refusing a second socket reporting it",
                existing.settings().address
            ));
        }
        match self.by_sanitized.entry(sanitized.clone()) {
            dashmap::Entry::Occupied(e) if e.get() != name => {
                return Err(format!(
                    "driver name {name:?} collides with driver {:?}: both use finalizer external-attacher/{sanitized} and Lease external-attacher-leader-{sanitized}",
                    e.get()
                ));
            }
            dashmap::Entry::Occupied(_) => {}
            dashmap::Entry::Vacant(e) => {
                e.insert(name.to_string());
            }
        }
        self.by_name.insert(name.to_string(), driver.clone());
        Ok(())
    }

    /// Releases `name` if `driver` holds it.
    pub fn unregister(&self, name: &str, driver: &Arc<Driver>) {
        let _claim = self.claims.lock();
        let removed = self
            .by_name
            .remove_if(name, |_, d| Arc::ptr_eq(d, driver))
            .is_some();
        if removed {
            self.by_sanitized
                .remove(&crate::names::sanitize_driver_name(name));
        }
    }

    /// The driver serving `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Driver>> {
        self.by_name.get(name).map(|d| d.value().clone())
    }

    /// The driver whose sanitized name is `sanitized`.
    pub(crate) fn by_sanitized(&self, sanitized: &str) -> Option<(String, Arc<Driver>)> {
        let name = self.by_sanitized.get(sanitized)?.value().clone();
        let driver = self.get(&name)?;
        Some((name, driver))
    }

    /// Adds a configured slot.
    pub fn add_slot(&self, driver: Arc<Driver>) {
        self.slots.write().push(driver);
        self.slots_changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes whenever a slot is added or removed (the value itself means nothing).
    pub fn slots_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.slots_changed.subscribe()
    }

    /// Removes a slot (its driver has stopped); its name, if it had one, is retired.
    pub fn remove_slot(&self, driver: &Arc<Driver>) {
        self.slots.write().retain(|d| !Arc::ptr_eq(d, driver));
        self.slots_changed.send_modify(|n| *n = n.wrapping_add(1));
        if let Some(name) = driver.name() {
            self.retired.lock().push(name);
        }
    }

    /// The names of the slots removed since the last call.
    pub fn take_retired(&self) -> Vec<String> {
        std::mem::take(&mut *self.retired.lock())
    }

    /// Every configured slot.
    pub fn slots(&self) -> Vec<Arc<Driver>> {
        self.slots.read().clone()
    }

    /// Calls `f` with each slot, without copying the list (for every watch event of a kind).
    /// `f` must not block nor reach the registry again.
    pub fn each_slot(&self, mut f: impl FnMut(&Arc<Driver>)) {
        for d in self.slots.read().iter() {
            f(d);
        }
    }
}

impl Names for Registry {
    fn register(&self, name: &str, driver: &Arc<Driver>) -> Result<(), String> {
        Registry::register(self, name, driver)
    }

    fn unregister(&self, name: &str, driver: &Arc<Driver>) {
        Registry::unregister(self, name, driver);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::driver::Origin;

    fn driver(socket: &str) -> Arc<Driver> {
        let defaults =
            crate::config::Defaults::with_identity(&crate::cli::Args::default(), "h".into());
        Driver::new(
            defaults.settings_for(socket.parse().expect("socket path")),
            Origin::Discovered,
        )
    }

    #[test]
    fn two_sockets_reporting_one_name_at_once_never_both_register() {
        for round in 0..200 {
            let registry = Arc::new(Registry::default());
            let (a, b) = (driver("/a.sock"), driver("/b.sock"));
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let racers: Vec<_> = [a.clone(), b.clone()]
                .into_iter()
                .map(|d| {
                    let (registry, barrier) = (registry.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        registry.register("same.csi.io", &d).is_ok()
                    })
                })
                .collect();
            let won: Vec<bool> = racers
                .into_iter()
                .map(|t| t.join().expect("racer"))
                .collect();
            assert_eq!(
                won.iter().filter(|w| **w).count(),
                1,
                "round {round}: {won:?}"
            );
            // The loser's unregister does not release the winner's name.
            let (winner, loser) = if won[0] { (&a, &b) } else { (&b, &a) };
            registry.unregister("same.csi.io", loser);
            assert!(
                registry
                    .get("same.csi.io")
                    .is_some_and(|d| Arc::ptr_eq(&d, winner))
            );
        }
    }

    #[test]
    fn names_that_share_a_finalizer_are_refused_and_only_the_holder_releases_a_name() {
        let registry = Registry::default();
        let (first, second) = (driver("/a.sock"), driver("/b.sock"));
        registry.register("a.b", &first).expect("free");
        registry.register("a.b", &first).expect("the holder again");
        let refused = registry
            .register("a-b", &second)
            .expect_err("same finalizer");
        assert!(
            refused.contains("collides with driver \"a.b\"")
                && refused.contains("external-attacher/a-b"),
            "{refused}"
        );
        let refused = registry.register("a.b", &second).expect_err("same name");
        assert!(
            refused.contains("already served by socket unix:///a.sock"),
            "{refused}"
        );
        let (name, holder) = registry.by_sanitized("a-b").expect("held");
        assert_eq!(name, "a.b");
        assert!(Arc::ptr_eq(&holder, &first));
        // The loser's release changes nothing; the holder's frees name and finalizer.
        Names::unregister(&registry, "a.b", &second);
        assert!(registry.get("a.b").is_some());
        Names::unregister(&registry, "a.b", &first);
        assert!(registry.get("a.b").is_none() && registry.by_sanitized("a-b").is_none());
        Names::register(&registry, "a-b", &second).expect("free now");
    }

    #[test]
    fn a_removed_slot_retires_its_name_once() {
        let registry = Registry::default();
        let defaults =
            crate::config::Defaults::with_identity(&crate::cli::Args::default(), "h".into());
        let named = Driver::named(
            defaults.settings_for("/x.sock".parse().expect("socket path")),
            Origin::Configured,
            "x.csi.io",
        );
        let unnamed = driver("/y.sock");
        registry.add_slot(named.clone());
        registry.add_slot(unnamed.clone());
        assert_eq!(registry.slots().len(), 2);
        registry.remove_slot(&named);
        registry.remove_slot(&unnamed);
        assert!(registry.slots().is_empty());
        assert_eq!(registry.take_retired(), ["x.csi.io"]);
        assert!(registry.take_retired().is_empty());
    }
}
