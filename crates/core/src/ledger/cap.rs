//! What a request may take of a backend: the in-flight limit and where its flow stands
//! ([`Cap`], [`Claim`]).

use super::BANDS;
use crate::units::Tokens;

/// How many requests in flight an account takes: the in-flight `limit` (0: none), and
/// where its flow stands ([`Claim`]). A plain `usize` is a limit with no claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cap {
    /// Requests in flight at most (0: no limit).
    pub limit: usize,
    /// Where its flow stands against the other active flows (default: no flow control).
    pub claim: Claim,
    /// Slots past the limit and the hold this request may take (default 0): those it
    /// just freed by stopping requests there, which they let go a moment later.
    pub over: usize,
    /// Its prompt tokens, as estimated at admission (default 0): counted in its
    /// backend's KV in flight, which a request leaving the reserve free keeps under the
    /// backend's capacity less what the requests the reserve is kept for had lately.
    pub tokens: Tokens,
}

/// Where a request's flow stands, as flow control sees it when it is placed.
///
/// A held backend keeps a reserve: an eighth of what it ran when it last queued (its
/// ceiling), at least one slot, and more where the requests it is kept for recently had
/// more in flight at once than they have now (up to half the ceiling), so that a light
/// tenant's conversations find their slots free where their prefixes are. Where the
/// backend published its KV capacity, a request leaving the reserve also leaves the KV
/// those requests had in flight lately. A reserve counts only where a hold was learned: a
/// backend with room is never held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Neither kept for nor leaving the reserve (and every request without a tenants
    /// file): it takes what the limit and the hold allow, less `standing` slots.
    Open {
        /// Slots of a held backend it leaves free (the tenants file's `standing_slots`),
        /// so that a light flow or a higher priority arriving at a full fleet finds
        /// them at once; never a backend's every slot.
        standing: usize,
    },
    /// It leaves the reserve free: its tenant is over its fair share while another is
    /// below, or a higher priority is active.
    Leaves,
    /// The reserve is kept for it.
    Kept(Kept),
}

impl Default for Claim {
    fn default() -> Self {
        Claim::Open { standing: 0 }
    }
}

/// A request the reserve is kept for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The band it counts in (its priority, 0 lowest, below [`BANDS`]): its new
    /// conversations spread by the requests of its own band in flight
    /// ([`place`](super::place)), not by those of a band kept before it.
    pub band: usize,
    /// Slots it leaves free, as [`Claim::Open`]'s: kept for only against a lower
    /// priority while a higher one may still arrive, it leaves `standing_slots`.
    pub standing: usize,
    /// Whether it is a light flow's (its tenant is below its fair share, or it is `high`
    /// while a lower priority is active), and if so its conversation
    /// ([`Request::conversation`](crate::policy::Request::conversation); 0 until
    /// [`Cap::of_conversation`]): the KV of [`protect_kv`](super::protect_kv) is kept
    /// for it, and counted in its home's.
    pub light: Option<u128>,
    /// Whether it goes to its conversation's home, where it may take slots past the
    /// backend's ceiling, up to its hold (into the engine's queue), rather than move and
    /// compute its context again elsewhere.
    pub home: bool,
}

impl Cap {
    /// A cap with no limit under `claim`.
    pub fn claiming(claim: Claim) -> Self {
        Cap {
            claim,
            ..Cap::default()
        }
    }

    /// Whether the reserve is kept for it.
    pub fn kept(&self) -> bool {
        matches!(self.claim, Claim::Kept(_))
    }

    /// Whether it leaves the reserve free.
    pub fn leaves(&self) -> bool {
        matches!(self.claim, Claim::Leaves)
    }

    /// Slots of a held backend it leaves free (0 for a request leaving the reserve,
    /// which leaves the reserve's instead).
    pub fn standing(&self) -> usize {
        match self.claim {
            Claim::Open { standing } | Claim::Kept(Kept { standing, .. }) => standing,
            Claim::Leaves => 0,
        }
    }

    /// Whether it goes to its conversation's home past the ceiling ([`Kept::home`]).
    pub(super) fn home(&self) -> bool {
        matches!(self.claim, Claim::Kept(Kept { home: true, .. }))
    }

    /// This cap going to its conversation's home ([`Kept::home`]); unchanged for a
    /// request the reserve is not kept for.
    pub fn at_home(self) -> Cap {
        match self.claim {
            Claim::Kept(kept) => Cap {
                claim: Claim::Kept(Kept { home: true, ..kept }),
                ..self
            },
            _ => self,
        }
    }

    /// The band it counts in among the requests a reserve is kept for, if it is one.
    pub(super) fn kept_band(&self) -> Option<usize> {
        match self.claim {
            Claim::Kept(kept) => Some(kept.band.min(BANDS - 1)),
            _ => None,
        }
    }

    /// Whether it is a light flow's request kept a reserve for: the KV of
    /// [`protect_kv`](super::protect_kv) is kept for it.
    pub fn light(&self) -> bool {
        matches!(self.claim, Claim::Kept(Kept { light: Some(_), .. }))
    }

    /// Its light flow's conversation, once counted ([`Self::of_conversation`]).
    pub(super) fn conversation(&self) -> Option<u128> {
        match self.claim {
            Claim::Kept(Kept { light: Some(c), .. }) if c != 0 => Some(c),
            _ => None,
        }
    }

    /// This cap with its request's `conversation` ([`Kept::light`]), computed only where
    /// it is counted: for a light flow's request kept a reserve for (the hash is not paid
    /// without flow control).
    pub fn of_conversation(self, conversation: impl FnOnce() -> u128) -> Cap {
        match self.claim {
            Claim::Kept(kept @ Kept { light: Some(_), .. }) => {
                let light = Some(conversation());
                Cap {
                    claim: Claim::Kept(Kept { light, ..kept }),
                    ..self
                }
            }
            _ => self,
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
        assert_eq!(unhashed.conversation(), None);
        let kept = Cap::claiming(Claim::Kept(Kept::default()));
        assert_eq!(kept.of_conversation(|| 7).conversation(), None, "not light");
        let light = Cap::claiming(Claim::Kept(Kept {
            light: Some(0),
            ..Kept::default()
        }));
        assert_eq!(light.of_conversation(|| 7).conversation(), Some(7));
        let far = Cap::claiming(Claim::Kept(Kept {
            band: 9,
            ..Kept::default()
        }));
        assert_eq!(far.kept_band(), Some(BANDS - 1));
    }

    #[test]
    fn only_a_kept_request_goes_home_past_the_ceiling() {
        let kept = Cap {
            limit: 3,
            tokens: Tokens(40),
            ..Cap::claiming(Claim::Kept(Kept::default()))
        };
        let home = kept.at_home();
        assert!(home.home() && (home.limit, home.tokens) == (3, Tokens(40)));
        assert!(!Cap::claiming(Claim::Leaves).at_home().home());
        assert!(!Cap::from(2).at_home().home());
    }
}
