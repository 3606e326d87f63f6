//! A bounded MessagePack reader for the payloads engines publish (vLLM's KV events). It
//! reads a whole payload into [`Value`]s, and refuses rather than trusts: a length is never
//! used to reserve memory beyond the bytes that remain, nesting is capped, and so is the
//! number of values one payload may hold. Truncated or malformed input is an error, never a
//! panic. Only what the events use is kept: extension types are skipped as opaque bytes.
//!
//! Why not `rmpv`, the `rmp` family's reader of whole values: it caps nesting and never
//! reserves for a declared length either, but it has no bound on how many values one
//! payload yields, and a value of one byte of input (a nil) costs at least 32 bytes of
//! memory (a test below shows both). A flood of events would be read whole before anything could refuse
//! it; here the caller's `max_values` refuses it while reading.

/// Deepest nesting of arrays and maps accepted.
pub const MAX_DEPTH: usize = 16;

/// A decoded value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `nil`.
    Nil,
    /// `true` / `false`.
    Bool(bool),
    /// A non-negative integer.
    Uint(u64),
    /// A negative integer.
    Int(i64),
    /// A float (32-bit ones widened).
    Float(f64),
    /// A string (invalid UTF-8 kept as bytes).
    Str(Vec<u8>),
    /// Binary data (and extension types, as their payload).
    Bin(Vec<u8>),
    /// An array.
    Array(Vec<Value>),
    /// A map, in order.
    Map(Vec<(Value, Value)>),
}

/// Why a payload could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MsgpackError {
    /// It ended inside a value.
    #[error("truncated at byte {0}")]
    Truncated(usize),
    /// A byte that starts no MessagePack value (0xc1).
    #[error("invalid type byte 0x{byte:02x} at byte {at}")]
    Invalid { byte: u8, at: usize },
    /// Arrays and maps nest deeper than [`MAX_DEPTH`].
    #[error("nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// More values than the reader was allowed.
    #[error("more than {0} values")]
    TooMany(usize),
    /// Bytes left after the value.
    #[error("{0} bytes after the value")]
    Trailing(usize),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(n) => Some(n),
            Value::Int(n) => u64::try_from(n).ok(),
            _ => None,
        }
    }

    /// The value as a string, if it is a UTF-8 string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }

    /// The value of `key` in a map whose keys are strings.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => (entries.iter())
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Reads exactly one value from `bytes`, of at most `max_values` values in all.
pub fn read(bytes: &[u8], max_values: usize) -> Result<Value, MsgpackError> {
    let mut reader = Reader {
        bytes,
        at: 0,
        left: max_values,
        max_values,
    };
    let value = reader.value(0)?;
    match bytes.len() - reader.at {
        0 => Ok(value),
        n => Err(MsgpackError::Trailing(n)),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    left: usize,
    max_values: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], MsgpackError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(MsgpackError::Truncated(self.bytes.len()))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn uint(&mut self, n: usize) -> Result<u64, MsgpackError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| acc << 8 | u64::from(b)))
    }

    fn value(&mut self, depth: usize) -> Result<Value, MsgpackError> {
        self.left = (self.left.checked_sub(1)).ok_or(MsgpackError::TooMany(self.max_values))?;
        let at = self.at;
        let byte = self.take(1)?[0];
        Ok(match byte {
            0x00..=0x7f => Value::Uint(u64::from(byte)),
            0xe0..=0xff => Value::Int(i64::from(byte as i8)),
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xcc => Value::Uint(self.uint(1)?),
            0xcd => Value::Uint(self.uint(2)?),
            0xce => Value::Uint(self.uint(4)?),
            0xcf => Value::Uint(self.uint(8)?),
            0xd0 => Value::Int(i64::from(self.uint(1)? as u8 as i8)),
            0xd1 => Value::Int(i64::from(self.uint(2)? as u16 as i16)),
            0xd2 => Value::Int(i64::from(self.uint(4)? as u32 as i32)),
            0xd3 => Value::Int(self.uint(8)? as i64),
            0xca => Value::Float(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.uint(8)?)),
            0xa0..=0xbf => Value::Str(self.bytes_of(usize::from(byte & 0x1f))?),
            0xd9 => self.sized(1, Value::Str)?,
            0xda => self.sized(2, Value::Str)?,
            0xdb => self.sized(4, Value::Str)?,
            0xc4 => self.sized(1, Value::Bin)?,
            0xc5 => self.sized(2, Value::Bin)?,
            0xc6 => self.sized(4, Value::Bin)?,
            0xd4 => self.extension(1)?,
            0xd5 => self.extension(2)?,
            0xd6 => self.extension(4)?,
            0xd7 => self.extension(8)?,
            0xd8 => self.extension(16)?,
            0xc7 => self.sized_extension(1)?,
            0xc8 => self.sized_extension(2)?,
            0xc9 => self.sized_extension(4)?,
            0x90..=0x9f => self.array(usize::from(byte & 0x0f), depth)?,
            0xdc => self.counted(2, depth, Self::array)?,
            0xdd => self.counted(4, depth, Self::array)?,
            0x80..=0x8f => self.map(usize::from(byte & 0x0f), depth)?,
            0xde => self.counted(2, depth, Self::map)?,
            0xdf => self.counted(4, depth, Self::map)?,
            0xc1 => return Err(MsgpackError::Invalid { byte, at }),
        })
    }

    fn bytes_of(&mut self, n: usize) -> Result<Vec<u8>, MsgpackError> {
        Ok(self.take(n)?.to_vec())
    }

    fn sized(&mut self, width: usize, make: fn(Vec<u8>) -> Value) -> Result<Value, MsgpackError> {
        let n = self.uint(width)? as usize;
        Ok(make(self.bytes_of(n)?))
    }

    fn extension(&mut self, n: usize) -> Result<Value, MsgpackError> {
        self.take(1)?;
        Ok(Value::Bin(self.bytes_of(n)?))
    }

    fn sized_extension(&mut self, width: usize) -> Result<Value, MsgpackError> {
        let n = self.uint(width)? as usize;
        self.extension(n)
    }

    /// An array or map (`read`) whose count is in the next `width` bytes.
    fn counted(
        &mut self,
        width: usize,
        depth: usize,
        read: fn(&mut Self, usize, usize) -> Result<Value, MsgpackError>,
    ) -> Result<Value, MsgpackError> {
        let n = self.uint(width)? as usize;
        read(self, n, depth)
    }

    /// Room for at most what the remaining bytes can hold (a value takes one byte at least).
    fn room(&self, n: usize) -> usize {
        n.min(self.bytes.len() - self.at).min(self.left)
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Value, MsgpackError> {
        if depth >= MAX_DEPTH {
            return Err(MsgpackError::TooDeep);
        }
        let mut items = Vec::with_capacity(self.room(n));
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Value, MsgpackError> {
        if depth >= MAX_DEPTH {
            return Err(MsgpackError::TooDeep);
        }
        let mut entries = Vec::with_capacity(self.room(n) / 2);
        for _ in 0..n {
            let key = self.value(depth + 1)?;
            entries.push((key, self.value(depth + 1)?));
        }
        Ok(Value::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_kind_it_uses() {
        // [1.5, [{"type": "x", "n": -3, "big": 2^40}], nil]
        let mut b = vec![0x93, 0xcb];
        b.extend(1.5f64.to_bits().to_be_bytes());
        b.extend([0x91, 0x83, 0xa4]);
        b.extend(b"type");
        b.extend([0xa1, b'x', 0xa1, b'n', 0xfd, 0xa3]);
        b.extend(b"big");
        b.push(0xcf);
        b.extend((1u64 << 40).to_be_bytes());
        b.push(0xc0);
        let v = read(&b, 100).unwrap();
        let Value::Array(items) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(items[0], Value::Float(1.5));
        let Value::Array(events) = &items[1] else {
            panic!()
        };
        assert_eq!(events[0].get("type").and_then(Value::as_str), Some("x"));
        assert_eq!(events[0].get("n"), Some(&Value::Int(-3)));
        assert_eq!(events[0].get("big").and_then(Value::as_u64), Some(1 << 40));
        assert_eq!(items[2], Value::Nil);
    }

    #[test]
    fn refuses_without_trusting_lengths() {
        // An array claiming 2^32-1 items in 6 bytes: an error, and no 4-billion reservation.
        assert_eq!(
            read(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01], 1 << 20),
            Err(MsgpackError::Truncated(6))
        );
        assert_eq!(
            read(&[0xdb, 0xff, 0xff, 0xff, 0xff], 10),
            Err(MsgpackError::Truncated(5))
        );
        assert_eq!(
            read(&[0xc1], 10),
            Err(MsgpackError::Invalid { byte: 0xc1, at: 0 })
        );
        assert_eq!(read(&[0x91; 40], 100), Err(MsgpackError::TooDeep));
        assert_eq!(read(&[0x01, 0x02], 10), Err(MsgpackError::Trailing(1)));
        let million: Vec<u8> = [0xdd, 0x00, 0x0f, 0x42, 0x40]
            .into_iter()
            .chain(std::iter::repeat_n(0x01, 1_000_000))
            .collect();
        assert_eq!(read(&million, 1000), Err(MsgpackError::TooMany(1000)));
        assert!(matches!(read(&million, 2_000_000), Ok(Value::Array(a)) if a.len() == 1_000_000));
    }

    #[test]
    fn never_panics_on_any_prefix_or_byte_flip() {
        let mut b = vec![
            0x92, 0xcd, 0x01, 0x00, 0x92, 0xa2, b'h', b'i', 0xc4, 0x02, 0xff, 0x00,
        ];
        for cut in 0..b.len() {
            let _ = read(&b[..cut], 100);
        }
        for i in 0..b.len() {
            for byte in [0x00, 0x7f, 0xc1, 0xdd, 0xdf, 0xff] {
                let old = std::mem::replace(&mut b[i], byte);
                let _ = read(&b, 100);
                b[i] = old;
            }
        }
    }

    #[test]
    fn rmpv_reads_a_flood_of_values_that_this_reader_refuses() {
        // An array of 200,000 nils: 200,005 bytes in, a value each out.
        let mut payload = vec![0xdd];
        payload.extend_from_slice(&200_000u32.to_be_bytes());
        payload.resize(5 + 200_000, 0xc0);
        let whole = rmpv::decode::read_value(&mut payload.as_slice()).unwrap();
        assert_eq!(whole.as_array().map(Vec::len), Some(200_000));
        assert!(std::mem::size_of::<rmpv::Value>() >= 32);
        assert_eq!(read(&payload, 100_000), Err(MsgpackError::TooMany(100_000)));
    }
}
