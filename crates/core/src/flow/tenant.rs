//! A tenant's id: its name from the tenants file, shared rather than copied by every
//! request and table that names it.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

/// A tenant's name, cheap to clone (one shared allocation per tenant). Ordered, compared
/// and hashed as its name, so that a table keyed by it is looked up by `&str`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(Arc<str>);

impl TenantId {
    /// The tenant named `name`.
    pub fn new(name: &str) -> Self {
        TenantId(Arc::from(name))
    }

    /// Its name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id of requests of no tenant (no tenants file): the empty name.
    pub fn none() -> &'static TenantId {
        static NONE: LazyLock<TenantId> = LazyLock::new(|| TenantId::new(""));
        &NONE
    }
}

impl Deref for TenantId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for TenantId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for TenantId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for TenantId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn an_id_is_looked_up_ordered_and_shown_as_its_name() {
        let a = TenantId::new("a");
        let table: HashMap<TenantId, u32> = [(a.clone(), 1)].into();
        assert_eq!(table.get("a"), Some(&1));
        assert!(TenantId::new("b") > a);
        assert_eq!(
            (format!("{a}"), format!("{a:?}")),
            ("a".into(), "\"a\"".into())
        );
        assert!(TenantId::none().is_empty());
    }
}
