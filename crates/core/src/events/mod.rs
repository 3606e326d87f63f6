//! The engine's own record of its KV cache, as vLLM publishes it (`--kv-events-config`):
//! reading the published batches ([`decode`], on a bounded MessagePack reader,
//! [`msgpack`]). Pure: the subscriber that receives them lives in the router.

pub mod decode;
pub mod msgpack;
