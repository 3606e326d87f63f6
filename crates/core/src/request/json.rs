//! A minimal pull reader of JSON over borrowed bytes, built for one pass over large request
//! bodies: strings (most of a body) are crossed 16 or 32 bytes at a time with SIMD bit masks,
//! and come back as the escaped bytes between their quotes, never copied or unescaped.
//! It checks structure, escapes (including unpaired surrogates), control characters in
//! strings, number and literal syntax, nesting depth, and UTF-8 inside strings (only for
//! strings the block masks found non-ASCII bytes in; JSON allows them nowhere else). It is
//! not a general JSON library: it reads what routing needs.

use super::ParseError;

/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 128;

/// What the next value is, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    String,
    Array,
    Object,
    Null,
    Other,
}

/// A cursor over a JSON text.
pub struct Json<'a> {
    bytes: &'a [u8],
    at: usize,
    depth: usize,
    /// Bit `d` is set when the container at depth `d + 1` is an object.
    objects: u128,
}

impl<'a> Json<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Json {
            bytes,
            at: 0,
            depth: 0,
            objects: 0,
        }
    }

    fn error(&self, expected: &'static str) -> ParseError {
        ParseError::Syntax {
            at: self.at,
            expected,
        }
    }

    fn peek_byte(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes.get(self.at) {
            self.at += 1;
        }
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8, expected: &'static str) -> Result<(), ParseError> {
        if self.peek_byte() != Some(byte) {
            return Err(self.error(expected));
        }
        self.at += 1;
        Ok(())
    }

    /// The kind of the next value.
    pub fn kind(&mut self) -> Kind {
        match self.peek_byte() {
            Some(b'"') => Kind::String,
            Some(b'[') => Kind::Array,
            Some(b'{') => Kind::Object,
            Some(b'n') => Kind::Null,
            _ => Kind::Other,
        }
    }

    /// Only white space is left.
    pub fn end(&mut self) -> Result<(), ParseError> {
        match self.peek_byte() {
            None => Ok(()),
            Some(_) => Err(self.error("the end of the body")),
        }
    }

    /// Reads a string: the escaped bytes between its quotes. The hot loop of the parser: it
    /// classifies blocks of 32 bytes (AVX2) or 16 (SSE2) and finds the closing quote with bit
    /// masks, without a branch per escape (code in agent bodies has an escape every few dozen
    /// bytes); blocks with `\u` escapes or escaped backslashes take the escape-by-escape path.
    pub fn string(&mut self) -> Result<&'a [u8], ParseError> {
        self.eat(b'"', "a string")?;
        let start = self.at;
        let (mut ended, ascii) = self.string_blocks()?;
        while !ended {
            let found =
                special(&self.bytes[self.at..]).ok_or_else(|| self.error("the end of a string"))?;
            self.at += found;
            ended = self.special_byte()?;
        }
        let string = &self.bytes[start..self.at - 1];
        if !ascii {
            std::str::from_utf8(string).map_err(|_| ParseError::NotUtf8)?;
        }
        Ok(string)
    }

    /// The block scan of [`Self::string`], at the widest vectors the CPU has.
    #[allow(unsafe_code)]
    fn string_blocks(&mut self) -> Result<(bool, bool), ParseError> {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.string_blocks_avx2() };
        }
        self.scan_blocks::<16>(classify)
    }

    /// [`Self::scan_blocks`] compiled for AVX2, on 32-byte blocks.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[allow(unsafe_code)]
    unsafe fn string_blocks_avx2(&mut self) -> Result<(bool, bool), ParseError> {
        self.scan_blocks::<32>(|block| simd::classify_avx2(block))
    }

    /// Crosses whole `N`-byte blocks of a string from `at`. Returns whether its closing quote
    /// was found (`at` is then past it; else fewer than `N` bytes are left), and whether all
    /// it crossed was ASCII (known from the block masks; else the caller checks UTF-8).
    #[inline(always)]
    fn scan_blocks<const N: usize>(
        &mut self,
        classify: impl Fn(&[u8; N]) -> Classes,
    ) -> Result<(bool, bool), ParseError> {
        let width = u32::MAX >> (32 - N);
        let mut high = 0;
        // 1 when the previous block ended with a backslash that escapes this block's first byte.
        let mut carry = 0;
        while let Some(block) = self.bytes[self.at..].first_chunk::<N>() {
            let c = classify(block);
            let escaped = ((c.backslash << 1) | carry) & width;
            if c.backslash & ((c.backslash << 1) | carry) != 0 || escaped & !c.simple != 0 {
                self.at -= carry as usize;
                carry = 0;
                high |= c.high;
                if self.block_by_escapes()? {
                    return Ok((true, false));
                }
                continue;
            }
            let end = c.quote & !escaped;
            let before_end = (end & end.wrapping_neg()).wrapping_sub(1);
            if c.control & before_end != 0 {
                self.at += c.control.trailing_zeros() as usize;
                return Err(self.error("no control character in a string"));
            }
            high |= c.high & before_end;
            if end != 0 {
                self.at += end.trailing_zeros() as usize + 1;
                return Ok((true, high == 0));
            }
            carry = c.backslash >> (N - 1);
            self.at += N;
        }
        self.at -= carry as usize;
        Ok((false, false))
    }

    /// Crosses the 16 bytes at `at` (and the escape that ends them) one special byte at a
    /// time; true when the string ended there.
    fn block_by_escapes(&mut self) -> Result<bool, ParseError> {
        let base = self.at;
        let Some(block) = self.bytes[base..].first_chunk::<16>() else {
            return Ok(false);
        };
        let c = classify(block);
        let mut mask = c.quote | c.backslash | c.control;
        while mask != 0 {
            self.at = base + mask.trailing_zeros() as usize;
            if self.special_byte()? {
                return Ok(true);
            }
            mask &= u32::MAX.checked_shl((self.at - base) as u32).unwrap_or(0);
        }
        self.at = self.at.max(base + 16);
        Ok(false)
    }

    /// Steps over the special byte at `at` (see [`special`]): true after a closing quote,
    /// false after an escape; a control character is an error.
    fn special_byte(&mut self) -> Result<bool, ParseError> {
        match self.bytes[self.at] {
            b'"' => {
                self.at += 1;
                Ok(true)
            }
            b'\\' => {
                self.at = escape_end(self.bytes, self.at + 1)?;
                Ok(false)
            }
            _ => Err(self.error("no control character in a string")),
        }
    }

    /// Reads `null`.
    pub fn null(&mut self) -> Result<(), ParseError> {
        self.peek_byte();
        self.literal(b"null")
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), ParseError> {
        if !self.bytes[self.at..].starts_with(word) {
            return Err(self.error("true, false or null"));
        }
        self.at += word.len();
        Ok(())
    }

    /// Reads a number (its syntax is checked, its value is not).
    pub fn number(&mut self) -> Result<&'a [u8], ParseError> {
        self.peek_byte();
        let start = self.at;
        let digits = |j: &mut Self| {
            let from = j.at;
            while j.bytes.get(j.at).is_some_and(u8::is_ascii_digit) {
                j.at += 1;
            }
            j.at > from
        };
        self.at += usize::from(self.bytes.get(self.at) == Some(&b'-'));
        let leading_zero = self.bytes.get(self.at) == Some(&b'0');
        let mut ok = digits(self)
            && (!leading_zero || self.at - start - usize::from(self.bytes[start] == b'-') == 1);
        if ok && self.bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            ok = digits(self);
        }
        if ok && matches!(self.bytes.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            self.at += usize::from(matches!(self.bytes.get(self.at), Some(b'+' | b'-')));
            ok = digits(self);
        }
        match ok {
            true => Ok(&self.bytes[start..self.at]),
            false => Err(self.error("a number")),
        }
    }

    fn push(&mut self, object: bool) -> Result<(), ParseError> {
        if self.depth >= MAX_DEPTH {
            return Err(ParseError::TooDeep { max: MAX_DEPTH });
        }
        self.objects = (self.objects & !(1 << self.depth)) | (u128::from(object) << self.depth);
        self.depth += 1;
        self.at += 1;
        Ok(())
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && self.objects & (1 << (self.depth - 1)) != 0
    }

    /// Reads an object, calling `member` with each key; `member` reads its value.
    pub fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Result<(), ParseError>,
    ) -> Result<(), ParseError> {
        if self.peek_byte() != Some(b'{') {
            return Err(self.error("an object"));
        }
        self.push(true)?;
        if self.close_if(b'}') {
            return Ok(());
        }
        loop {
            let key = self.key()?;
            member(self, key)?;
            if self.next_or_close(b'}')? {
                return Ok(());
            }
        }
    }

    /// Reads an array, calling `element` for each element; `element` reads it.
    pub fn array(
        &mut self,
        mut element: impl FnMut(&mut Self) -> Result<(), ParseError>,
    ) -> Result<(), ParseError> {
        if self.peek_byte() != Some(b'[') {
            return Err(self.error("an array"));
        }
        self.push(false)?;
        if self.close_if(b']') {
            return Ok(());
        }
        loop {
            element(self)?;
            if self.next_or_close(b']')? {
                return Ok(());
            }
        }
    }

    fn key(&mut self) -> Result<&'a [u8], ParseError> {
        let key = self.string()?;
        self.eat(b':', "`:`")?;
        Ok(key)
    }

    fn close_if(&mut self, closer: u8) -> bool {
        if self.peek_byte() != Some(closer) {
            return false;
        }
        self.at += 1;
        self.depth -= 1;
        true
    }

    /// After a member or element: `,` (false) or the closing bracket (true).
    fn next_or_close(&mut self, closer: u8) -> Result<bool, ParseError> {
        match self.peek_byte() {
            Some(b',') => {
                self.at += 1;
                Ok(false)
            }
            _ if self.close_if(closer) => Ok(true),
            _ => Err(self.error("`,` or a closing bracket")),
        }
    }

    /// Skips the next value, whatever it is, without recursion.
    pub fn skip(&mut self) -> Result<(), ParseError> {
        let base = self.depth;
        loop {
            self.skip_scalar_or_open()?;
            while self.depth > base {
                let closer = if self.in_object() { b'}' } else { b']' };
                if !self.next_or_close(closer)? {
                    if self.in_object() {
                        self.key()?;
                    }
                    break;
                }
            }
            if self.depth == base {
                return Ok(());
            }
        }
    }

    /// Skips a scalar, or enters a container (reading the first key of an object); an empty
    /// container is entered and left.
    fn skip_scalar_or_open(&mut self) -> Result<(), ParseError> {
        match self.peek_byte() {
            Some(b'"') => self.string().map(drop),
            Some(b'-' | b'0'..=b'9') => self.number().map(drop),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(open @ (b'[' | b'{')) => {
                let object = open == b'{';
                self.push(object)?;
                let closer = if object { b'}' } else { b']' };
                if self.close_if(closer) {
                    return Ok(());
                }
                if object {
                    self.key()?;
                }
                self.skip_scalar_or_open()
            }
            _ => Err(self.error("a value")),
        }
    }

    /// Skips the next value and returns its bytes.
    pub fn raw(&mut self) -> Result<&'a [u8], ParseError> {
        self.peek_byte();
        let start = self.at;
        self.skip()?;
        Ok(&self.bytes[start..self.at])
    }
}

/// Index of the first `"`, `\` or control character (below 0x20) in `bytes`, one byte at a
/// time: for the last few bytes of a body, after [`special_mask`] on whole blocks.
fn special(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| is_special(b))
}

fn is_special(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// Bit masks over a block of up to 32 bytes (bit `i` for byte `i`) of what a string scan
/// looks for.
#[derive(Debug, PartialEq, Eq)]
struct Classes {
    quote: u32,
    backslash: u32,
    /// Below 0x20: not allowed unescaped in a string.
    control: u32,
    /// Letters of the escapes that stand alone: `" \ / b f n r t` (not `u`).
    simple: u32,
    /// Not ASCII (0x80 and above).
    high: u32,
}

/// [`Classes`] of `block`: SSE2 compares and move masks, about twenty instructions for 16
/// bytes. The parser's hot loop (`cargo bench --bench parse`).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn classify(block: &[u8; 16]) -> Classes {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of the x86_64 baseline, so these intrinsics are always available;
    // the load reads exactly the 16 bytes `block` borrows, with no alignment requirement.
    unsafe {
        let v = _mm_loadu_si128(block.as_ptr().cast());
        let eq = |b: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8));
        let bits = |m: __m128i| _mm_movemask_epi8(m) as u32;
        let low = _mm_set1_epi8(0x1f);
        let (quote, backslash) = (eq(b'"'), eq(b'\\'));
        let letters = [eq(b'/'), eq(b'b'), eq(b'f'), eq(b'n'), eq(b'r'), eq(b't')];
        let simple = letters
            .into_iter()
            .fold(_mm_or_si128(quote, backslash), |a, m| _mm_or_si128(a, m));
        Classes {
            quote: bits(quote),
            backslash: bits(backslash),
            control: bits(_mm_cmpeq_epi8(_mm_max_epu8(v, low), low)),
            simple: bits(simple),
            high: bits(v),
        }
    }
}

/// [`Classes`] of `block`, a byte at a time.
#[cfg(not(target_arch = "x86_64"))]
fn classify(block: &[u8; 16]) -> Classes {
    portable_classify(block)
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn portable_classify(block: &[u8; 16]) -> Classes {
    let mask = |f: &dyn Fn(u8) -> bool| {
        (block.iter().enumerate()).fold(0, |m, (i, &b)| m | (u32::from(f(b)) << i))
    };
    Classes {
        quote: mask(&|b| b == b'"'),
        backslash: mask(&|b| b == b'\\'),
        control: mask(&|b| b < 0x20),
        simple: mask(&|b| b"\"\\/bfnrt".contains(&b)),
        high: mask(&|b| b >= 0x80),
    }
}

/// Wider vectors for [`Json::string`].
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd {
    use std::arch::x86_64::*;

    use super::Classes;

    /// [`Classes`] of a 32-byte block with AVX2 compares and move masks.
    #[target_feature(enable = "avx2")]
    pub(super) fn classify_avx2(block: &[u8; 32]) -> Classes {
        // SAFETY: the load reads exactly the 32 bytes `block` borrows (unaligned is allowed).
        let v = unsafe { _mm256_loadu_si256(block.as_ptr().cast()) };
        let eq = |b: u8| _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b as i8));
        let bits = |m: __m256i| _mm256_movemask_epi8(m) as u32;
        let low = _mm256_set1_epi8(0x1f);
        let (quote, backslash) = (eq(b'"'), eq(b'\\'));
        let letters = [eq(b'/'), eq(b'b'), eq(b'f'), eq(b'n'), eq(b'r'), eq(b't')];
        let simple = (letters.into_iter()).fold(_mm256_or_si256(quote, backslash), |a, m| {
            _mm256_or_si256(a, m)
        });
        Classes {
            quote: bits(quote),
            backslash: bits(backslash),
            control: bits(_mm256_cmpeq_epi8(_mm256_max_epu8(v, low), low)),
            simple: bits(simple),
            high: bits(v),
        }
    }
}

/// Index after the escape whose letter is at `at`.
fn escape_end(bytes: &[u8], at: usize) -> Result<usize, ParseError> {
    match bytes.get(at) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 1),
        Some(b'u') => unicode_escape_end(bytes, at),
        _ => Err(ParseError::BadEscape("invalid escape")),
    }
}

fn unicode_escape_end(bytes: &[u8], at: usize) -> Result<usize, ParseError> {
    match hex4(bytes, at + 1)? {
        0xD800..=0xDBFF => {
            let low = (bytes.get(at + 5..at + 7) == Some(b"\\u")).then(|| hex4(bytes, at + 7));
            match low.transpose()? {
                Some(0xDC00..=0xDFFF) => Ok(at + 11),
                _ => Err(ParseError::BadEscape("unpaired high surrogate")),
            }
        }
        0xDC00..=0xDFFF => Err(ParseError::BadEscape("unpaired low surrogate")),
        _ => Ok(at + 5),
    }
}

fn hex4(bytes: &[u8], at: usize) -> Result<u32, ParseError> {
    let digits = bytes
        .get(at..at + 4)
        .ok_or(ParseError::BadEscape("truncated \\u escape"))?;
    digits.iter().try_fold(0u32, |acc, &d| {
        let value = (d as char)
            .to_digit(16)
            .ok_or(ParseError::BadEscape("invalid \\u escape"))?;
        Ok(acc * 16 + value)
    })
}

#[cfg(test)]
mod tests;
