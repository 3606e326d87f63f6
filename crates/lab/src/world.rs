//! The discrete-event simulation: clients that follow the replay's schedule (sessions
//! start at their arrival times, each next turn a think time after the previous answer,
//! all under the replay's concurrency cap, first come first served; with flows, one party
//! of clients per flow, `parties`), the lab's router replicas (each with its admission,
//! `control`, and with flows and a tenants file its flow control), and one simulator
//! engine per backend, all on one virtual clock. Events are handled in time order, ties
//! in a fixed order, so a run is a pure function of its inputs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use prefix_router_replay::{ExchangeResult, Plan, RequestOutcome, RunResult, ServedUsage};
use prefix_router_sim::SimConfig;
use prefix_router_sim::engine::{EngineCore, Output};

use crate::prepare::{RequestShapes, Shape};
use std::sync::Arc;

use prefix_router_core::clock::Manual;
use prefix_router_core::policy::Published;

use crate::router::{Asked, LabRouter, Placement, RouterSetup};
use crate::scenario::Flows;
use prefix_router_core::flow::{NO_FLOW_CONTROL, Share, Shares, Stoppable};
use prefix_router_core::ledger::Cap;

mod control;
mod notes;
mod parties;
mod requests;

use control::{LabControl, Pending};
use notes::{Notes, routers};
pub use parties::FlowResult;
use parties::Party;

/// How the clients behave: what the replay's options would say.
#[derive(Clone, Debug)]
pub struct Clients {
    /// Model name in the bodies.
    pub model: String,
    /// Streamed responses (TTFT is measured only then).
    pub stream: bool,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Stop after this many requests.
    pub max_requests: Option<usize>,
    /// Send each session's id as `x-session-id`.
    pub send_session_header: bool,
}

/// What happens around the router, and what it knows of the engines.
#[derive(Clone, Copy, Debug, Default)]
pub struct Situation {
    /// The router sees the engines' own records (their KV events, without delay) and
    /// routes in token mode; else it predicts from what it sent (text mode).
    pub exact: bool,
    /// Share of requests, 0..=1, that clients send straight to a backend (one drawn per
    /// request), past the router.
    pub bypass: f64,
    /// Backend 0's engine loses its whole prefix cache when half the requests have been
    /// sent (a restart as the cache sees it; its requests in flight finish).
    pub restart: bool,
    /// Seed of the bypass draws.
    pub seed: u64,
}

/// What one run produced.
pub struct Run {
    /// The outcomes, as the replay records them.
    pub result: RunResult,
    /// KV blocks the engines evicted.
    pub kv_evicted_blocks: u64,
    /// Prefix-index text the router evicted, bytes.
    pub index_evicted_bytes: u64,
    /// The router's predicted hit rate: matched / routed text bytes.
    pub predicted_hit_rate: Option<f64>,
    /// The hit rate of the requests the router placed (all but those that bypassed it).
    pub routed_hit_rate: Option<f64>,
    /// The router's decisions by outcome.
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
    /// Routing text routed, bytes.
    pub text_bytes: u64,
    /// Each flow's outcomes, when the scenario has flows.
    pub flows: Vec<FlowResult>,
}

/// A workload: its plan, with the shapes the engines give its requests.
pub type ShapedWorkload<'w> = (&'w Plan, &'w RequestShapes);

/// Runs `workloads` through a router set up as `router` in front of one engine per name in
/// `backends`, each configured as `sim`: one workload sent by `clients`, or, with `flows`,
/// one workload per flow sent by clients of its own. The result's outcomes are the first
/// measured flow's (the first flow's when none is measured).
#[allow(clippy::too_many_arguments)]
pub fn run(
    workloads: &[ShapedWorkload],
    backends: &[String],
    sim: &SimConfig,
    router: &RouterSetup,
    clients: &Clients,
    situation: &Situation,
    flows: Option<&Flows>,
) -> Run {
    let sessions = workloads.iter().flat_map(|(plan, _)| plan.sessions());
    let total: usize = sessions.map(|s| s.turns().len()).sum();
    let total = total.min(clients.max_requests.unwrap_or(usize::MAX));
    let clock = Manual::default();
    let (routers, notes) = routers(router, backends, &clock);
    let replicas = router.replicas.max(1);
    let shares: Vec<Shares> = (0..replicas)
        .map(|_| Shares::new(Arc::new(clock.clone())))
        .collect();
    let parties = Party::split(workloads, clients.concurrency, flows);
    let tenants = flows.filter(|f| f.control);
    let control = (shares.iter())
        .map(|s| match tenants {
            Some(flows) => LabControl::new(s, Some(flows)),
            None => LabControl::new(&NO_FLOW_CONTROL, None),
        })
        .collect();
    let mut world = World {
        clients,
        situation,
        restart_at: situation.restart.then_some(total / 2),
        sent: 0,
        routed: (0, 0),
        names: backends,
        engines: (0..backends.len())
            .map(|_| EngineCore::new(sim.timing(), sim.kv_blocks))
            .collect(),
        routers,
        notes,
        next_replica: 0,
        scrapes: (0..router.replicas.max(1))
            .map(|r| r as f64 * router.scrape_interval / router.replicas.max(1) as f64)
            .collect(),
        scrape_interval: router.scrape_interval,
        queue: BinaryHeap::new(),
        seq: 0,
        parties,
        control,
        tenants: tenants.is_some(),
        pending_serial: 0,
        clock,
        budget: clients.max_requests.unwrap_or(usize::MAX),
        live: HashMap::new(),
        next_id: 0,
        first_arrival: None,
        last_end: 0.0,
    };
    world.run();
    let flows = parties::results(&world.parties, flows);
    let elapsed = world.last_end - world.first_arrival.unwrap_or(0.0);
    let routers = &world.routers;
    let sum = |of: fn(&LabRouter) -> u64| routers.iter().map(of).sum::<u64>();
    let (text_bytes, matched_bytes) = (sum(|r| r.text_bytes), sum(|r| r.matched_bytes));
    let mut outcomes = std::collections::BTreeMap::new();
    for (outcome, n) in routers.iter().flat_map(|r| r.outcomes.iter()) {
        *outcomes.entry(*outcome).or_default() += n;
    }
    Run {
        kv_evicted_blocks: world.engines.iter().map(|e| e.cache().evicted()).sum(),
        index_evicted_bytes: sum(|r| r.evicted_bytes),
        outcomes,
        text_bytes,
        flows,
        predicted_hit_rate: (text_bytes > 0).then(|| matched_bytes as f64 / text_bytes as f64),
        routed_hit_rate: (world.routed.1 > 0)
            .then(|| world.routed.0 as f64 / world.routed.1 as f64),
        result: RunResult {
            outcomes: parties::main_outcomes(world.parties),
            elapsed: seconds(elapsed),
        },
    }
}

/// Something due at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum WorldEvent {
    /// The next session's arrival in a party: its dispatcher starts it.
    Dispatch { party: usize },
    /// A session's next turn is ready to be sent.
    Turn {
        party: usize,
        session: usize,
        turn: usize,
    },
    /// A request waiting in router replica `replica`'s queue since its `pending` number
    /// waited its longest (`queue_timeout`).
    Expire { replica: usize, pending: u64 },
}

/// A client waiting for a concurrency slot.
#[derive(Clone, Copy, Debug)]
struct Want {
    /// The party its client belongs to.
    party: usize,
    session: usize,
    turn: usize,
    /// When it became ready to send (for the send lag).
    ready: f64,
}

/// How admission has a request placed: under its cap, on its home alone when it stays
/// there, with its place in the flows.
struct Flowing<'w> {
    cap: Cap,
    only: Option<usize>,
    pending: Pending<'w>,
}

/// A request at an engine.
struct InFlight<'w> {
    want: Want,
    sent: f64,
    /// The router's placement; `None` when the client bypassed the router.
    placement: Option<Placement>,
    /// The router replica that placed it.
    replica: usize,
    first: Option<f64>,
    cached: usize,
    prompt: usize,
    /// With flow control: its count in its flow's share, and, until its answer, its
    /// place among the requests one outranking it may stop.
    share: Option<Share<'w>>,
    preemptible: Option<Stoppable<'w>>,
}

/// Where a session stands: its turns scheduled or sent and not ended, and the next turn
/// not yet scheduled.
#[derive(Clone, Copy, Debug, Default)]
struct SessionProgress {
    /// Its turns scheduled or sent, and not ended.
    in_flight: usize,
    /// The next turn not yet scheduled.
    next: usize,
}

struct World<'w> {
    clients: &'w Clients,
    situation: &'w Situation,
    /// When (in requests sent) backend 0 restarts, if it does.
    restart_at: Option<usize>,
    /// Requests sent so far.
    sent: usize,
    /// Cached and prompt tokens of the requests the router placed.
    routed: (u64, u64),
    names: &'w [String],
    engines: Vec<EngineCore>,
    /// The router replicas; requests go to them in turn.
    routers: Vec<LabRouter>,
    /// Their notes to one another, delivered `note_delay` after they were made.
    notes: Notes,
    next_replica: usize,
    /// When each replica next reads the engines' published load.
    scrapes: Vec<f64>,
    scrape_interval: f64,
    queue: BinaryHeap<Reverse<(u64, u64, WorldEvent)>>,
    seq: u64,
    /// The groups of clients, each with its workload, sessions and concurrency.
    parties: Vec<Party<'w>>,
    /// Each router replica's admission (with its flow control when the router has a
    /// tenants file).
    control: Vec<LabControl<'w>>,
    /// Whether the router has a tenants file: holds are learnt, flows' shares counted.
    tenants: bool,
    /// Requests admitted so far (each admission numbered).
    pending_serial: u64,
    /// The routers' clock.
    clock: Manual,
    budget: usize,
    live: HashMap<u64, InFlight<'w>>,
    next_id: u64,
    first_arrival: Option<f64>,
    last_end: f64,
}

fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or_default()
}

impl<'w> World<'w> {
    fn run(&mut self) {
        let firsts = (self.parties.iter()).filter_map(|p| p.plan.sessions().first());
        self.first_arrival = firsts.map(|s| s.start_ms() / 1000.0).min_by(f64::total_cmp);
        for party in 0..self.parties.len() {
            if let Some(start) = self.parties[party].upcoming() {
                self.at(start, WorldEvent::Dispatch { party });
            }
        }
        while !parties::measured_done(&self.parties) {
            let queued = self
                .queue
                .peek()
                .map(|Reverse((t, _, _))| f64::from_bits(*t));
            let engine = (self.engines.iter())
                .filter_map(EngineCore::next_deadline)
                .min_by(f64::total_cmp);
            let now = match (queued, engine) {
                (None, None) => return,
                (Some(q), Some(e)) => q.min(e),
                (q, e) => q.or(e).unwrap_or_default(),
            };
            for engine in &mut self.engines {
                engine.advance(now);
            }
            if self.tenants {
                // The flows' shares read it (without, only placements set it).
                self.clock.set(seconds(now));
            }
            self.scrape(now);
            self.drain_engines();
            self.settle(now);
            while let Some(&Reverse((t, _, event))) = self.queue.peek() {
                if f64::from_bits(t) > now {
                    break;
                }
                self.queue.pop();
                self.handle(now, event);
                self.settle(now);
            }
            self.drain_engines();
            self.settle(now);
        }
    }

    fn at(&mut self, time: f64, event: WorldEvent) {
        self.seq += 1;
        self.queue
            .push(Reverse((time.max(0.0).to_bits(), self.seq, event)));
    }

    fn handle(&mut self, now: f64, event: WorldEvent) {
        match event {
            WorldEvent::Dispatch { party } => {
                let Some(session) = self.parties[party].start_next() else {
                    return;
                };
                self.parties[party].progress[session].in_flight += 1;
                self.want(
                    now,
                    Want {
                        party,
                        session,
                        turn: 0,
                        ready: now,
                    },
                );
            }
            WorldEvent::Turn {
                party,
                session,
                turn,
            } => self.want(
                now,
                Want {
                    party,
                    session,
                    turn,
                    ready: now,
                },
            ),
            WorldEvent::Expire { replica, pending } => self.expire(now, replica, pending),
        }
    }

    /// A client asks for a slot: sent at once if one is free, else it waits in line. The
    /// dispatcher waits with its session, so later sessions start after it.
    fn want(&mut self, now: f64, want: Want) {
        let party = &mut self.parties[want.party];
        if party.free_slots > 0 {
            party.free_slots -= 1;
            self.granted(now, want);
        } else {
            party.waiting.push_back(want);
        }
    }

    /// A slot of `party` came free at `now`: the first in line takes it.
    fn release(&mut self, now: f64, party: usize) {
        match self.parties[party].waiting.pop_front() {
            Some(want) => self.granted(now, want),
            None => self.parties[party].free_slots += 1,
        }
    }

    fn granted(&mut self, now: f64, want: Want) {
        if want.turn == 0
            && let Some(start) = self.parties[want.party].upcoming()
        {
            let party = want.party;
            self.at(start.max(now), WorldEvent::Dispatch { party });
        }
        if self.budget == 0 {
            self.parties[want.party].free_slots += 1;
            return;
        }
        self.budget -= 1;
        self.arrive(now, want);
        self.schedule_next(now, want, true);
    }

    /// Replicas whose read of the engines' published load is due at `now` read it.
    fn scrape(&mut self, now: f64) {
        for replica in 0..self.scrapes.len() {
            if self.scrapes[replica] > now {
                continue;
            }
            self.scrapes[replica] = now + self.scrape_interval;
            for (backend, engine) in self.engines.iter().enumerate() {
                let load = Published {
                    running: engine.running(),
                    waiting: engine.waiting(),
                    kv_usage: engine.cache().usage(),
                };
                self.routers[replica].published(backend, load, self.tenants);
            }
            self.after_read(replica);
        }
    }

    /// Places, on router replica `replica`, the request the client sent at `sent`, at `now`
    /// (or sends it straight to a backend when it bypasses the router).
    fn dispatch(&mut self, now: f64, want: Want, sent: f64, replica: usize, flowing: Flowing<'w>) {
        self.sent += 1;
        if self.restart_at == Some(self.sent) {
            self.engines[0].advance(now);
            self.engines[0].forget_cache();
        }
        let shape = self.shape(want);
        self.notes.deliver(replica, seconds(now));
        let cap = flowing.cap;
        let placed = if self.bypasses(want) {
            Ok(None)
        } else {
            match self.place(now, want, shape, replica, cap, flowing.only) {
                Ok(None) => return self.unplaced(now, flowing.pending),
                placed => placed,
            }
        };
        let backend = match &placed {
            Ok(Some(p)) => p.backend,
            Ok(None) => self.bypass_backend(want),
            Err(_) => return self.refused(now, sent, want, None, replica, 400),
        };
        let placement = placed.ok().flatten();
        let Some(shape) = shape else {
            return self.refused(now, sent, want, placement, replica, 500);
        };
        let Some(mut request) = shape.request(self.next_id) else {
            let status = match shape {
                Shape::Refused(status) => *status,
                Shape::Accepted { .. } => 500,
            };
            return self.refused(now, sent, want, placement, replica, status);
        };
        if self.tenants {
            // The router's `X-Vllm-Priority`.
            request.priority = self.parties[want.party].identity().1.vllm();
        }
        let (share, preemptible) =
            self.flow_placed(flowing.pending, placement.as_ref(), cap, self.next_id);
        let engine = &mut self.engines[backend];
        engine.advance(now);
        let prompt = request.prompt_tokens;
        engine.submit(request);
        self.live.insert(
            self.next_id,
            InFlight {
                want,
                sent,
                placement,
                replica,
                first: None,
                cached: 0,
                prompt,
                share,
                preemptible,
            },
        );
        self.next_id += 1;
    }

    /// The router replica's placement of `want` under `cap` (on backend `only` when
    /// given), with the engines' records in exact mode; `None` when no backend is open.
    fn place(
        &mut self,
        now: f64,
        want: Want,
        shape: Option<&Shape>,
        replica: usize,
        cap: Cap,
        only: Option<usize>,
    ) -> Result<Option<Placement>, prefix_router_core::request::ParseError> {
        let (body, session_id) = self.body(want);
        let record = self.records(shape);
        let asked = Asked {
            body: &body,
            session_id,
            record: record.as_ref(),
        };
        self.routers[replica].place(now, asked, cap, only)
    }

    /// A request answered with an error status at once (the router's 400, the
    /// simulator's refusal), sent by the client at `sent`.
    fn refused(
        &mut self,
        now: f64,
        sent: f64,
        want: Want,
        placement: Option<Placement>,
        replica: usize,
        status: u16,
    ) {
        // The placement ends here, before the next request is placed.
        let backend = placement.as_ref().map(|p| self.names[p.backend].clone());
        if let Some(placement) = placement {
            self.routers[replica].refused(placement);
        }
        let exchange = ExchangeResult {
            backend,
            error: Some(format!("http_{status}")),
            ..ExchangeResult::default()
        };
        self.record(want, sent, now, exchange);
        self.ended(now, want);
    }

    fn drain_engines(&mut self) {
        for backend in 0..self.engines.len() {
            for output in self.engines[backend].take_outputs() {
                self.output(backend, output);
            }
        }
    }

    fn output(&mut self, backend: usize, output: Output) {
        match output {
            Output::Admitted { .. } => {}
            Output::FirstToken {
                id,
                at,
                cached_tokens,
                ..
            } => {
                let Some(live) = self.live.get_mut(&id) else {
                    return;
                };
                (live.first, live.cached) = (Some(at), cached_tokens);
                // Answered: no longer one a request outranking it may stop.
                live.preemptible = None;
                if let (true, Some(placement)) = (self.clients.stream, &live.placement) {
                    self.routers[live.replica].answered(placement);
                }
            }
            Output::Finished {
                id,
                at,
                output_tokens,
            } => {
                let Some(live) = self.live.remove(&id) else {
                    return;
                };
                if let Some(placement) = live.placement {
                    let (prompt, cached) = (live.prompt as u64, live.cached as u64);
                    self.routers[live.replica].reported(&placement, prompt, cached);
                    self.routed.0 += live.cached as u64;
                    self.routed.1 += live.prompt as u64;
                }
                let stream = self.clients.stream;
                let exchange = ExchangeResult {
                    backend: Some(self.names[backend].clone()),
                    ttft: live
                        .first
                        .filter(|_| stream)
                        .map(|f| seconds(f - live.sent)),
                    usage: Some(ServedUsage {
                        prompt_tokens: live.prompt as u64,
                        cached_tokens: Some(live.cached as u64),
                        completion_tokens: output_tokens as u64,
                    }),
                    error: None,
                    retry_after: None,
                };
                let want = live.want;
                self.record(want, live.sent, at, exchange);
                self.ended(at, want);
            }
            Output::Rejected { id } => {
                let Some(live) = self.live.remove(&id) else {
                    return;
                };
                if let Some(placement) = live.placement {
                    self.routers[live.replica].refused(placement);
                }
                let now = self.engines[backend].now();
                let want = live.want;
                let exchange = ExchangeResult {
                    backend: Some(self.names[backend].clone()),
                    error: Some("http_400".into()),
                    ..ExchangeResult::default()
                };
                self.record(want, now, now, exchange);
                self.ended(now, want);
            }
        }
    }

    fn record(&mut self, want: Want, sent: f64, end: f64, exchange: ExchangeResult) {
        self.parties[want.party].ended();
        self.last_end = self.last_end.max(end);
        self.parties[want.party].outcomes.push(RequestOutcome {
            session: want.session as u32,
            turn: want.turn as u32,
            sent: seconds(sent - self.first_arrival.unwrap_or(0.0)),
            lag: seconds(sent - want.ready),
            e2e: seconds(end - sent),
            exchange,
        });
    }

    /// A request ended at `now`: a request held by the router may take its backend slot,
    /// its client slot goes to the next in line, and its session's next turn is due a think
    /// time later once every answer of the session is in.
    fn ended(&mut self, now: f64, want: Want) {
        self.release(now, want.party);
        let progress = &mut self.parties[want.party].progress[want.session];
        progress.in_flight = progress.in_flight.saturating_sub(1);
        self.schedule_next(now, want, false);
    }

    /// Schedules `session`'s next turn a think time after `now`: one that overlaps when a
    /// turn was just `sent`, one that waits when the session has nothing in flight.
    fn schedule_next(&mut self, now: f64, want: Want, sent: bool) {
        let (party, session) = (want.party, want.session);
        let progress = self.parties[party].progress[session];
        let turns = self.parties[party].plan.sessions()[session].turns();
        let Some(next) = turns.get(progress.next.max(1)) else {
            return;
        };
        let due = if sent {
            next.overlaps()
        } else {
            !next.overlaps() && progress.in_flight == 0
        };
        if due {
            let turn = progress.next.max(1);
            self.parties[party].progress[session] = SessionProgress {
                in_flight: progress.in_flight + 1,
                next: turn + 1,
            };
            self.at(
                now + next.think_ms() / 1000.0,
                WorldEvent::Turn {
                    party,
                    session,
                    turn,
                },
            );
        }
    }
}
