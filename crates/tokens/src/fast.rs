//! The same token ids by a shorter road, for the tokenizers most chat models ship: byte-level
//! BPE after one regex split (GPT-2's layout: Qwen, Llama 3, DeepSeek, Mistral's Tekken...).
//! The `tokenizers` crate tracks every byte's alignment through its pipeline, which is most
//! of its time; ids need none of it. Here the text is cut at added tokens (leftmost
//! longest, as the crate's added vocabulary cuts it), each piece split by the
//! pre-tokenizer's own regex, mapped to byte-level characters and handed to the crate's own
//! BPE model. Used only when the tokenizer is exactly that shape (checked once at load)
//! and its normalizer, if any, leaves the text as it is; `tests/tokens` and the property
//! tests compare the result with the crate's and with Hugging Face's.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde_json::Value;
use tokenizers::utils::SysRegex;
use tokenizers::{Model as _, ModelWrapper, Tokenizer};

/// The shortcut for one tokenizer.
pub(crate) struct Fast {
    added: AhoCorasick,
    added_ids: Vec<u32>,
    split: SysRegex,
    byte_chars: [char; 256],
}

impl Fast {
    /// The shortcut for `tokenizer`, if it has the shape this handles.
    pub fn new(tokenizer: &Tokenizer) -> Option<Fast> {
        if !matches!(tokenizer.get_model(), ModelWrapper::BPE(_))
            || tokenizer.get_truncation().is_some()
            || tokenizer.get_padding().is_some()
        {
            return None;
        }
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
        let split = split_pattern(&pre)?;
        let normalized = tokenizer.get_normalizer().is_some();
        let decoder = tokenizer.get_added_tokens_decoder();
        let plain = |t: &tokenizers::AddedToken| {
            !(t.lstrip || t.rstrip || t.single_word || (t.normalized && normalized))
        };
        if !decoder.values().all(plain) {
            return None;
        }
        let (added_ids, contents): (Vec<u32>, Vec<String>) =
            decoder.into_iter().map(|(id, t)| (id, t.content)).unzip();
        let added = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&contents)
            .ok()?;
        Some(Fast {
            added,
            added_ids,
            split: SysRegex::new(&split).ok()?,
            byte_chars: byte_chars(),
        })
    }

    /// The ids of `text`, tokenized without special tokens added.
    pub fn encode(&self, model: &ModelWrapper, text: &str) -> Result<Vec<u32>, String> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut at = 0;
        for (start, end, id) in self.cuts(text) {
            self.segment(model, &text[at..start], &mut ids)?;
            ids.push(id);
            at = end;
        }
        self.segment(model, &text[at..], &mut ids)?;
        Ok(ids)
    }

    /// The added tokens in `text`, leftmost longest: (start, end, id).
    pub fn cuts<'t>(&'t self, text: &'t str) -> impl Iterator<Item = (usize, usize, u32)> + 't {
        (self.added.find_iter(text))
            .map(|m| (m.start(), m.end(), self.added_ids[m.pattern().as_usize()]))
    }

    /// The ids of text without added tokens, appended to `ids`: split by the regex
    /// (matches and the gaps between them are pieces), each piece's bytes as byte-level
    /// characters, through the BPE model.
    pub fn segment(
        &self,
        model: &ModelWrapper,
        text: &str,
        ids: &mut Vec<u32>,
    ) -> Result<(), String> {
        let mut word = String::new();
        let mut at = 0;
        for (start, end) in self.split.find_iter(text) {
            if start > at {
                self.piece(model, &text[at..start], &mut word, ids)?;
            }
            self.piece(model, &text[start..end], &mut word, ids)?;
            at = end;
        }
        if at < text.len() {
            self.piece(model, &text[at..], &mut word, ids)?;
        }
        Ok(())
    }

    fn piece(
        &self,
        model: &ModelWrapper,
        piece: &str,
        word: &mut String,
        ids: &mut Vec<u32>,
    ) -> Result<(), String> {
        if piece.is_empty() {
            return Ok(());
        }
        word.clear();
        word.extend(piece.bytes().map(|b| self.byte_chars[usize::from(b)]));
        let tokens = model.tokenize(word).map_err(|e| e.to_string())?;
        ids.extend(tokens.iter().map(|t| t.id));
        Ok(())
    }
}

/// The regex of a pre-tokenizer that is `Split(regex, Isolated)` then `ByteLevel` without a
/// prefix space or regex of its own.
fn split_pattern(pre: &Value) -> Option<String> {
    let steps = match pre["type"].as_str()? {
        "Sequence" => pre["pretokenizers"].as_array()?,
        _ => return None,
    };
    let [split, byte_level] = steps.as_slice() else {
        return None;
    };
    let isolated =
        split["type"] == "Split" && split["behavior"] == "Isolated" && split["invert"] == false;
    let bytes = byte_level["type"] == "ByteLevel"
        && byte_level["add_prefix_space"] == false
        && byte_level["use_regex"] == false;
    (isolated && bytes)
        .then(|| split["pattern"]["Regex"].as_str().map(str::to_string))
        .flatten()
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the others for
/// the characters from U+0100 on, in order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[usize::from(b)] = match printable(b) {
            true => char::from(b),
            false => {
                next += 1;
                char::from_u32(next - 1).unwrap_or('\0')
            }
        };
    }
    table
}
