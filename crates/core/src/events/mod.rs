//! The engine's own record of its KV cache, as vLLM publishes it (`--kv-events-config`):
//! reading the published batches ([`decode`], on a bounded MessagePack reader,
//! [`msgpack`]) and keeping what each engine holds ([`held`]), and the prompts a router
//! sent that no record shows yet ([`sent`]). Pure: the subscriber that receives them lives
//! in the router.

pub mod decode;
pub mod held;
pub mod msgpack;
pub mod sent;
