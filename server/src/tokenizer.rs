//! The text side: `tokenizer.json` through the `tokenizers` crate, the chat template of
//! `tokenizer_config.json` through `minijinja`, and the end-of-sequence ids.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// The fixture tokenizer (byte-level BPE, vocabulary 2048), built into the binary.
pub const FIXTURE_TOKENIZER: &str = include_str!("../fixtures/test-tokenizer/tokenizer.json");
/// The fixture's `tokenizer_config.json` (a Llama 3 style chat template).
pub const FIXTURE_CONFIG: &str = include_str!("../fixtures/test-tokenizer/tokenizer_config.json");

/// A failure to load or use the tokenizer or its template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// `tokenizer.json` or `tokenizer_config.json` is not valid.
    #[error("loading the tokenizer: {0}")]
    Load(String),
    /// Encoding or decoding failed.
    #[error("tokenizing: {0}")]
    Tokenize(String),
    /// The chat template failed to compile or render (or called `raise_exception`).
    #[error("rendering the chat template: {0}")]
    Template(String),
    /// The tokenizer has no chat template.
    #[error("the tokenizer has no chat template")]
    NoTemplate,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text: a string, or (as OpenAI accepts) an array of `{"type": "text", "text": ...}`
    /// parts, joined.
    #[serde(deserialize_with = "content_de")]
    pub content: String,
    /// An optional participant name (accepted, passed to the template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `content`: a string or an array of text parts (other part types are refused).
fn content_de<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        text: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
    }
    match Content::deserialize(d)? {
        Content::Text(t) => Ok(t),
        Content::Parts(parts) => parts
            .into_iter()
            .map(|p| match (p.kind.as_str(), p.text) {
                ("text", Some(t)) => Ok(t),
                (k, _) => Err(serde::de::Error::custom(format!(
                    "content parts of type {k:?} are not supported (only \"text\" with \"text\")"
                ))),
            })
            .collect(),
    }
}

/// A tokenizer with its chat template and end-of-sequence ids.
#[derive(Debug)]
pub struct TextTokenizer {
    tk: tokenizers::Tokenizer,
    template: Option<String>,
    bos_token: String,
    eos_token: String,
    eos_ids: Vec<u32>,
    /// The special added tokens' text (`<|eot_id|>`, ...), which `encode` turns into control
    /// tokens wherever they appear.
    specials: Vec<String>,
}

fn token_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

impl TextTokenizer {
    /// Builds from the text of `tokenizer.json` and `tokenizer_config.json`, adding `extra_eos`
    /// (e.g. `config.json`'s `eos_token_id`) to the end-of-sequence ids.
    ///
    /// ```
    /// use server::tokenizer::{TextTokenizer, FIXTURE_TOKENIZER, FIXTURE_CONFIG};
    /// let t = TextTokenizer::from_json(FIXTURE_TOKENIZER, FIXTURE_CONFIG, &[]).unwrap();
    /// let ids = t.encode("hello world", false).unwrap();
    /// assert_eq!(t.decode(&ids).unwrap(), "hello world");
    /// ```
    ///
    /// # Errors
    /// [`TokenizerError::Load`] for invalid JSON or a tokenizer the crate cannot build.
    pub fn from_json(
        tokenizer: &str,
        config: &str,
        extra_eos: &[u32],
    ) -> Result<TextTokenizer, TokenizerError> {
        let tk = tokenizers::Tokenizer::from_bytes(tokenizer.as_bytes())
            .map_err(|e| TokenizerError::Load(format!("tokenizer.json: {e}")))?;
        let cfg: Value = serde_json::from_str(config)
            .map_err(|e| TokenizerError::Load(format!("tokenizer_config.json: {e}")))?;
        let template = match cfg.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: take "default".
            Some(Value::Array(a)) => a
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .map(str::to_string),
            _ => None,
        };
        let bos_token = token_text(cfg.get("bos_token"));
        let eos_token = token_text(cfg.get("eos_token"));
        let mut eos_ids: Vec<u32> = extra_eos.to_vec();
        for name in [eos_token.as_str(), "<|end_of_text|>", "<|eot_id|>"] {
            if let Some(id) = tk.token_to_id(name) {
                if !name.is_empty() && !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        }
        let mut specials: Vec<String> = tk
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        specials.sort();
        Ok(TextTokenizer { tk, template, bos_token, eos_token, eos_ids, specials })
    }

    /// The fixture tokenizer built into the binary.
    ///
    /// # Errors
    /// As [`TextTokenizer::from_json`] (not expected for the fixture).
    pub fn fixture() -> Result<TextTokenizer, TokenizerError> {
        TextTokenizer::from_json(FIXTURE_TOKENIZER, FIXTURE_CONFIG, &[])
    }

    /// Loads `dir/tokenizer.json` and `dir/tokenizer_config.json`, with `dir/config.json`'s
    /// `eos_token_id` (a number or a list) when present.
    ///
    /// # Errors
    /// [`TokenizerError::Io`] for a missing file; [`TokenizerError::Load`] for an `eos_token_id`
    /// that is not an integer in `u32`; as [`TextTokenizer::from_json`].
    pub fn from_dir(dir: &Path) -> Result<TextTokenizer, TokenizerError> {
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read_to_string(&p)
                .map_err(|source| TokenizerError::Io { path: p.display().to_string(), source })
        };
        let mut eos = Vec::new();
        if let Ok(text) = read("config.json") {
            let v: Value =
                serde_json::from_str(&text).map_err(|e| TokenizerError::Load(format!("config.json: {e}")))?;
            // Anything but an integer in u32 (past u32, negative, fractional, not a number) is
            // refused, not truncated (found by review: `x as u32` made 4294967298 the id 2, and
            // every stream then ended at token 2).
            let id = |x: &Value| {
                x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
                    TokenizerError::Load(format!("config.json: eos_token_id {x} is not a token id"))
                })
            };
            match v.get("eos_token_id") {
                Some(n @ Value::Number(_)) => eos.push(id(n)?),
                Some(Value::Array(a)) => {
                    for x in a {
                        eos.push(id(x)?);
                    }
                }
                _ => {}
            }
        }
        TextTokenizer::from_json(&read("tokenizer.json")?, &read("tokenizer_config.json")?, &eos)
    }

    /// The vocabulary size (with added tokens).
    pub fn vocab_size(&self) -> usize {
        self.tk.get_vocab_size(true)
    }

    /// The ids that end generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The first special token (`<|eot_id|>`, ...) whose text occurs in `text`, if any: such
    /// text would be encoded as the control token itself.
    ///
    /// ```
    /// let t = server::tokenizer::TextTokenizer::fixture().unwrap();
    /// assert_eq!(t.special_in("hi<|eot_id|>"), Some("<|eot_id|>"));
    /// assert_eq!(t.special_in("<|not a token|>"), None);
    /// ```
    pub fn special_in(&self, text: &str) -> Option<&str> {
        if !text.contains('<') && !self.specials.iter().any(|s| !s.starts_with('<')) {
            return None;
        }
        self.specials.iter().find(|s| text.contains(s.as_str())).map(String::as_str)
    }

    /// The id of a token, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tk.token_to_id(token)
    }

    /// Encodes `text` (with the tokenizer's special tokens, e.g. BOS, when `add_special`).
    ///
    /// # Errors
    /// [`TokenizerError::Tokenize`].
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.tk
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Tokenize(e.to_string()))
    }

    /// Decodes `ids`, skipping special tokens; an incomplete UTF-8 character becomes U+FFFD.
    ///
    /// # Errors
    /// The tokenizer's errors.
    pub fn decode(&self, ids: &[u32]) -> Result<String, tokenizers::Error> {
        self.tk.decode(ids, true)
    }

    /// Renders the chat template over `messages` with the variables Hugging Face passes
    /// (`messages`, `bos_token`, `eos_token`, `add_generation_prompt`, `raise_exception`).
    ///
    /// # Errors
    /// [`TokenizerError::NoTemplate`]; [`TokenizerError::Template`] for a template that fails
    /// (including one that calls `raise_exception`).
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let src = self.template.as_deref().ok_or(TokenizerError::NoTemplate)?;
        let mut env = minijinja::Environment::new();
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template("chat", src).map_err(|e| TokenizerError::Template(e.to_string()))?;
        let tmpl = env.get_template("chat").map_err(|e| TokenizerError::Template(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            add_generation_prompt => add_generation_prompt,
        })
        .map_err(|e| TokenizerError::Template(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `config.json`'s `eos_token_id` past `u32` is refused (it was truncated: 4294967298 became
    /// the id 2); ids within range are read, as a number or in a list.
    #[test]
    fn eos_ids_past_u32_are_refused_not_truncated() {
        let dir = std::env::temp_dir().join(format!("tokenizer-eos-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), FIXTURE_TOKENIZER).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), FIXTURE_CONFIG).unwrap();
        for (config, want) in [
            (r#"{"eos_token_id": 4294967298}"#, None),
            (r#"{"eos_token_id": [1, 4294967298]}"#, None),
            (r#"{"eos_token_id": -1}"#, None),
            (r#"{"eos_token_id": [2, "x"]}"#, None),
            (r#"{"eos_token_id": 2}"#, Some(vec![2])),
            (r#"{"eos_token_id": [2, 3]}"#, Some(vec![2, 3])),
        ] {
            std::fs::write(dir.join("config.json"), config).unwrap();
            match (TextTokenizer::from_dir(&dir), want) {
                (Err(TokenizerError::Load(e)), None) => assert!(e.contains("not a token id"), "{e}"),
                (Ok(t), Some(ids)) => {
                    assert!(ids.iter().all(|i| t.eos_ids().contains(i)), "{config}: {:?}", t.eos_ids())
                }
                (r, w) => panic!("{config}: {:?} (wanted {w:?})", r.map(|t| t.eos_ids().to_vec())),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
