//! What a request may take of a backend: the in-flight limit and the flow-control
//! exceptions it carries ([`Cap`]).

use super::BANDS;

/// How many requests in flight an account takes: the in-flight `limit` (0: none), and
/// whether to leave a reserve free for others (flow control keeps it from a tenant over
/// its fair share while a tenant below its share is active, and from a lower priority
/// while a higher one is). The reserve is an eighth of what the backend ran when it last
/// queued (its ceiling), at least one slot, and more where the requests it is kept for
/// recently had more in flight at once than they have now (up to half the ceiling), so
/// that a light tenant's conversations find their slots free where their prefixes are.
/// Where the backend published its KV capacity, a request leaving the reserve also
/// leaves the KV those requests had in flight lately ([`Cap::tokens`]). A reserve counts
/// only where a hold was learned: a backend with room is never held back. A plain
/// `usize` is a limit with no reserve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cap {
    /// Requests in flight at most (0: no limit).
    pub limit: usize,
    /// Whether this request leaves the reserve free.
    pub reserve: bool,
    /// Whether this request is one the reserve is kept for (counted in how many of
    /// those a backend had at once).
    pub kept: bool,
    /// Whether it is of a light flow (default false): its tenant is below its fair share,
    /// or it is `high` while a lower priority is active. The KV of
    /// [`protect_kv`](super::protect_kv) is kept for such requests that the reserve is
    /// kept for.
    pub light: bool,
    /// Slots this request leaves free while it leaves no reserve and is not one the
    /// reserve is kept for, or is kept for only against a lower priority (the tenants
    /// file's `standing_slots`), so that a light flow or a higher priority arriving at a
    /// full fleet finds them at once; never a backend's every slot.
    pub standing: usize,
    /// The band a request the reserve is kept for counts in (its priority, 0 lowest,
    /// below [`BANDS`]): its new conversations spread by the requests of its own band in
    /// flight ([`Candidate::kept`](crate::policy::Candidate::kept)), not by those of a
    /// band kept before it.
    pub band: usize,
    /// Slots past the limit and the hold this request may take (default 0): those it
    /// just freed by stopping requests there, which they let go a moment later.
    pub over: usize,
    /// Its prompt tokens, as estimated at admission (default 0): counted in its
    /// backend's KV in flight, which a request leaving the reserve free keeps under the
    /// backend's capacity less what the requests the reserve is kept for had lately.
    pub tokens: usize,
    /// Whether it goes to its conversation's home, where a request the reserve is kept
    /// for may take slots past the backend's ceiling, up to its hold (into the engine's
    /// queue), rather than move and compute its context again elsewhere (default false).
    pub home: bool,
    /// Its conversation ([`Request::conversation`](crate::policy::Request::conversation);
    /// 0, the default: none): a light flow's is counted in its home's KV
    /// ([`protect_kv`](super::protect_kv)). Set by [`Self::of_conversation`].
    pub conversation: u128,
}

impl Cap {
    /// The band it counts in among the requests a reserve is kept for, if it is one.
    pub(super) fn kept_band(&self) -> Option<usize> {
        self.kept.then(|| self.band.min(BANDS - 1))
    }

    /// Whether it is a light flow's request kept a reserve for: the KV of
    /// [`protect_kv`](super::protect_kv) is kept for it.
    pub(super) fn top(&self) -> bool {
        self.kept && self.light
    }

    /// This cap with its request's `conversation` ([`Self::conversation`]), computed only
    /// where it is counted: for a light flow's request kept a reserve for (the hash is
    /// not paid without flow control).
    pub fn of_conversation(self, conversation: impl FnOnce() -> u128) -> Cap {
        Cap {
            conversation: if self.top() { conversation() } else { 0 },
            ..self
        }
    }
}

impl From<usize> for Cap {
    fn from(limit: usize) -> Self {
        Cap {
            limit,
            ..Cap::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_is_hashed_only_for_a_light_flows_request_kept_a_reserve_for() {
        let unhashed = Cap::default().of_conversation(|| panic!("hashed without flow control"));
        assert_eq!(unhashed.conversation, 0);
        let kept = Cap {
            kept: true,
            ..Cap::default()
        };
        assert_eq!(kept.of_conversation(|| 7).conversation, 0, "not light");
        let light = Cap {
            light: true,
            ..kept
        };
        assert_eq!(light.of_conversation(|| 7).conversation, 7);
        assert_eq!(Cap { band: 9, ..kept }.kept_band(), Some(BANDS - 1));
    }
}
