//! The models each backend serves, as its `GET /v1/models` lists them (OpenAI's shape;
//! vLLM lists its served names and, with `parent`, the LoRA adapters loaded on it). Read
//! by the metrics reader when a backend is first read and then every `models_interval`,
//! so adapters loaded at run time are seen. A backend that never answered a list, or
//! answered an empty one, serves every model as far as routing knows (a fleet of such backends routes as before);
//! one that listed its models once keeps its last list while a read fails.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use serde::Deserialize;

/// One model a backend serves.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
pub struct ServedModel {
    /// Its name (`id`), as requests give it in `model`.
    pub id: String,
    /// The base model of an adapter.
    #[serde(default)]
    pub parent: Option<String>,
}

/// A backend's list of models.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Served {
    /// Its models, sorted by name.
    pub models: Vec<ServedModel>,
}

/// Names longer than this are not a model (bytes).
const MAX_NAME: usize = 1024;
/// Models past this many in one list are not read.
const MAX_MODELS: usize = 4096;

impl Served {
    /// The list a `/v1/models` answer gives; `None` when it is not one.
    pub fn parse(body: &str) -> Option<Served> {
        #[derive(Deserialize)]
        struct List {
            data: Vec<ServedModel>,
        }
        let list: List = serde_json::from_str(body).ok()?;
        let models = (list.data.into_iter())
            .filter(|m| !m.id.is_empty() && m.id.len() <= MAX_NAME)
            .take(MAX_MODELS);
        Some(Served::new(models.collect()))
    }

    /// The list of `models`, sorted and without repeated names.
    pub fn new(mut models: Vec<ServedModel>) -> Served {
        models.sort_by(|a, b| a.id.cmp(&b.id));
        models.dedup_by(|a, b| a.id == b.id);
        Served { models }
    }

    /// Whether it lists `model`.
    pub fn serves(&self, model: &[u8]) -> bool {
        (self.models)
            .binary_search_by(|m| m.id.as_bytes().cmp(model))
            .is_ok()
    }
}

/// What a backend is known to serve, and when it was last read.
#[derive(Debug, Default)]
pub struct Models {
    served: ArcSwapOption<Served>,
    read: Mutex<Option<Instant>>,
    /// Whether `served` is a static pool's, never read.
    fixed: bool,
}

impl Models {
    /// What a backend serves: `pool`, when it is in static pools, else what it lists.
    pub fn new(pool: Option<Arc<Served>>) -> Models {
        Models {
            fixed: pool.is_some(),
            served: ArcSwapOption::new(pool),
            read: Mutex::default(),
        }
    }

    /// Its last list, if it ever answered one.
    pub fn served(&self) -> Option<Arc<Served>> {
        self.served.load_full()
    }

    /// Whether it may get requests for `model`: it lists it, or it never listed any (an
    /// empty list included).
    pub fn serves(&self, model: &[u8]) -> bool {
        (self.served.load().as_ref()).is_none_or(|s| s.models.is_empty() || s.serves(model))
    }

    /// Whether a read is due at `now`, every `interval` (never, for a static pool's); if
    /// so, it counts as read now.
    pub fn due(&self, now: Instant, interval: std::time::Duration) -> bool {
        if self.fixed {
            return false;
        }
        let mut read = self.read.lock();
        let due = read.is_none_or(|last| now.duration_since(last) >= interval);
        if due {
            *read = Some(now);
        }
        due
    }

    /// Keeps `served`, when it changed; returns whether it did.
    pub fn set(&self, served: Served) -> bool {
        let changed = self.served.load().as_deref() != Some(&served);
        if changed {
            self.served.store(Some(Arc::new(served)));
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vllm_list_with_an_adapter_is_read() {
        let body = r#"{"object":"list","data":[
            {"id":"big","object":"model","root":"/models/big","parent":null},
            {"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"big"}]}"#;
        let served = Served::parse(body).unwrap();
        assert!(served.serves(b"big") && served.serves(b"sql-lora"));
        assert!(!served.serves(b"small"));
        assert_eq!(served.models[1].parent.as_deref(), Some("big"));
        assert_eq!(Served::parse("{\"choices\":[]}"), None, "not a list");
        assert_eq!(Served::parse("not json"), None);
    }

    #[test]
    fn a_backend_that_never_listed_serves_everything() {
        let models = Models::default();
        assert!(models.serves(b"anything"));
        assert!(models.set(Served::parse(r#"{"data":[{"id":"big"}]}"#).unwrap()));
        assert!(!models.serves(b"anything"));
        assert!(!models.set(Served::parse(r#"{"data":[{"id":"big"}]}"#).unwrap()));
        assert!(models.set(Served::parse(r#"{"data":[]}"#).unwrap()));
        assert!(models.serves(b"anything"), "an empty list limits nothing");
    }
}
