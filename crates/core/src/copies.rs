//! Guard against copies of request bodies: counts the bytes this thread allocates while a
//! 400 KB agent conversation is parsed and routed. Parsing must borrow the body (no copy);
//! routing allocates the chain of block hashes (an eighth of the text) and stores only the
//! hashes of blocks the index did not hold; the one copy a request makes is the proxy
//! gathering the body into one buffer sized from Content-Length.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use serde_json::{Value, json};

use crate::policy::testing::{candidates, params};
use crate::policy::{Request, Selector, choose};
use crate::request::{Endpoint, parse};

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting bytes allocated per thread.
struct Counting;

#[allow(unsafe_code)]
// SAFETY: every call is passed to `System` unchanged; the counter is a const-initialized
// thread-local `Cell` (no allocation, no destructor), so counting cannot re-enter.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn count(bytes: usize) {
    let _ = ALLOCATED.try_with(|a| a.set(a.get() + bytes));
}

/// Bytes this thread allocated while `f` ran.
fn allocated_by<T>(f: impl FnOnce() -> T) -> usize {
    let before = ALLOCATED.with(Cell::get);
    std::hint::black_box(f());
    ALLOCATED.with(Cell::get) - before
}

/// An agent conversation of `turns` tool calls and results, about 10 KB each, as JSON.
fn conversation(turns: usize) -> Vec<Value> {
    let code = "fn step(x: &str) -> String {\n    format!(\"{x}\")\n}\n".repeat(200);
    let mut messages = vec![json!({"role": "system", "content": code})];
    for t in 0..turns {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": t,
            "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a.rs\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": t, "content": format!("{t}{code}")}));
    }
    messages
}

fn body(messages: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap()
}

#[test]
fn parsing_a_400_kb_body_copies_none_of_it() {
    let body = body(&conversation(40));
    assert!(body.len() > 400_000);
    let allocated = allocated_by(|| parse(Endpoint::Chat, &body).map(|p| p.text.len()));
    // The list of borrowed parts (tens of KB) is all parsing may allocate.
    assert!(
        allocated < body.len() / 4,
        "parsing a {} byte body allocated {allocated} bytes: is the body being copied?",
        body.len()
    );
}

fn selector() -> Selector {
    choose("cache_aware").unwrap().build(&params(0.3, 64))
}

fn route(selector: &Selector, body: &[u8]) {
    let parsed = parse(Endpoint::Chat, body).unwrap();
    let request = Request::new(parsed.model, &parsed.text, None);
    selector.select(&request, &candidates(&[0, 0]));
}

#[test]
fn routing_a_new_conversation_stores_its_hashes_not_its_text() {
    let selector = selector();
    let body = body(&conversation(40));
    let allocated = allocated_by(|| route(&selector, &body));
    // The parts list, the chain (an eighth of the text) and the index's copy of the chain.
    assert!(
        allocated < body.len() * 3 / 8,
        "routing a new {} byte conversation allocated {allocated} bytes: is the text stored?",
        body.len()
    );
}

#[test]
fn routing_the_next_turn_stores_only_the_new_turn() {
    let selector = selector();
    let mut messages = conversation(40);
    let route = |body: &[u8]| route(&selector, body);
    route(&body(&messages));
    messages.extend(conversation(1).into_iter().skip(1));
    let next = body(&messages);
    let allocated = allocated_by(|| route(&next));
    // The parts list and the new turn (about 10 KB), far from a copy of the conversation.
    assert!(
        allocated < 100_000,
        "routing the next turn of a {} byte conversation allocated {allocated} bytes (new turn: about 10 KB)",
        next.len()
    );
}
