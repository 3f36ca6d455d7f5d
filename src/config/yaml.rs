//! Where things are in the YAML text; the only part of this module that knows the parser.

use std::{borrow::Cow, fmt};

use serde::{Deserialize, Deserializer, de};
use serde_saphyr::{Location, MessageFormatter, Spanned, UserMessageFormatter};

use super::bounds::{MAX_DRIVERS, MAX_FILE_BYTES};

/// A schema-free YAML tree with the location of every key and value.
enum Node {
    Map(Vec<(Spanned<Key>, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Scalar,
}

/// A mapping key as text (non-string keys are kept as their rendering).
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                // Control characters (a quoted "a\nb") escaped: error messages stay on one line.
                Ok(Key(v
                    .chars()
                    .map(|c| {
                        if c.is_control() {
                            c.escape_default().to_string()
                        } else {
                            c.to_string()
                        }
                    })
                    .collect()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                Ok(Key("~".to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = a.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = a.next_entry()? {
                    entries.push(entry);
                }
                Ok(Node::Map(entries))
            }
        }
        d.deserialize_any(V)
    }
}

/// One node of the tree, by field path.
struct Entry {
    path: String,
    /// The key (map entries) or the item (sequence items); names the field in errors.
    at: Pos,
    /// Where the value starts.
    value: Pos,
    /// The value is a mapping.
    is_map: bool,
}

/// Every node of a document by field path, in document order.
pub(super) struct Index(Vec<Entry>);

fn pos(l: &Location) -> Pos {
    (l.line().max(1), l.column().max(1))
}

/// Deepest nesting of collections. The deepest field, `drivers[i].leaderElection.labels`,
/// sits in four; the parser's default (64) recurses deeper than a driver list ever needs.
const MAX_DEPTH: usize = 16;

/// Most YAML nodes (scalars, sequences, mappings; keys count), alias expansions included.
/// An entry with every field written has about 50, so [`MAX_DRIVERS`] such entries
/// fit twice over; the parser's default (250,000) takes seconds to build in a debug build.
const MAX_NODES: usize = 100_000;

/// Most events replayed by aliases in the whole document: enough to share a
/// `leaderElection` object of four settings (ten events) among every one of
/// [`MAX_DRIVERS`] entries, while a "billion laughs" document stops after this many
/// (in well under a second in a debug build).
const MAX_ALIAS_REPLAY_EVENTS: usize = 10 * MAX_DRIVERS;

/// The parser's options: its defaults (duplicate keys refused, non-finite untyped floats
/// refused) with a budget sized for driver lists. Every breach is an error at the position
/// where it happened, like any syntax error.
pub(super) fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_reader_input_bytes: Some(MAX_FILE_BYTES),
            max_depth: MAX_DEPTH,
            flow_nesting_limit: MAX_DEPTH,
            max_nodes: MAX_NODES,
            // Every node is one event, every collection one more for its end.
            max_events: 2 * MAX_NODES + 16,
            max_aliases: MAX_ALIAS_REPLAY_EVENTS,
            max_anchors: MAX_NODES,
            max_total_scalar_bytes: MAX_FILE_BYTES,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_ALIAS_REPLAY_EVENTS,
            max_replay_stack_depth: MAX_DEPTH,
        },
        // Comments are never read; not keeping them keeps them out of the event budget.
        emit_comments: false,
        // `.inf`/`.nan` reach the typed pass, which names the field they are refused for.
        non_finite_float_policy: serde_saphyr::options::NonFiniteFloatPolicy::PassThrough,
    }
}

/// Parses `text` without a schema; a syntax error comes back as its position and message.
pub(super) fn index(text: &str) -> Result<Index, (Pos, String)> {
    let root: Spanned<Node> =
        serde_saphyr::from_str_with_options(text, options()).map_err(|e| {
            let at = e.location().map_or((1, 1), |l| pos(&l));
            (at, message(&e))
        })?;
    let mut entries = Vec::new();
    let start = pos(&root.referenced);
    walk(&root.value, "", start, start, &mut entries);
    Ok(Index(entries))
}

fn walk(node: &Node, path: &str, at: Pos, value: Pos, out: &mut Vec<Entry>) {
    out.push(Entry {
        path: path.to_owned(),
        at,
        value,
        is_map: matches!(node, Node::Map(_)),
    });
    match node {
        Node::Map(entries) => {
            for (key, v) in entries {
                let child = if path.is_empty() {
                    key.value.0.clone()
                } else {
                    format!("{path}.{}", key.value.0)
                };
                walk(
                    &v.value,
                    &child,
                    pos(&key.referenced),
                    pos(&v.referenced),
                    out,
                );
            }
        }
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                let p = pos(&item.referenced);
                walk(&item.value, &format!("{path}[{i}]"), p, p, out);
            }
        }
        Node::Scalar => {}
    }
}

impl Index {
    /// Where `path` is written, or else its nearest written ancestor.
    pub(super) fn position(&self, path: &str) -> Pos {
        let mut path = path;
        loop {
            if let Some(e) = self.0.iter().find(|e| e.path == path) {
                return e.at;
            }
            match path.rfind(['.', '[']) {
                Some(cut) => path = &path[..cut],
                None => return (1, 1),
            }
        }
    }

    /// The position and field path of a deserialisation error.
    pub(super) fn locate_error(&self, e: &serde_saphyr::Error) -> (Pos, Option<String>) {
        let Some(at) = e.location().map(|l| pos(&l)) else {
            return ((1, 1), None);
        };
        let missing_field = matches!(
            e.without_snippet(),
            serde_saphyr::Error::SerdeMissingField { .. }
        );
        // A missing field is reported where its mapping starts; anything else at a key or
        // value: take the deepest match.
        let found = self
            .0
            .iter()
            .filter(|x| {
                if missing_field {
                    x.is_map && x.value == at
                } else {
                    x.at == at || x.value == at
                }
            })
            .max_by_key(|x| x.path.len());
        let found = found.or_else(|| self.0.iter().rev().find(|x| x.at <= at));
        (at, found.map(|x| x.path.clone()).filter(|p| !p.is_empty()))
    }
}

/// The parser's message, without location or snippet, on one line.
pub(super) fn message(e: &serde_saphyr::Error) -> String {
    let text: Cow<'_, str> = UserMessageFormatter.format_message(e.without_snippet());
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A 1-based (line, column).
pub(crate) type Pos = (u64, u64);
