//! The JSON answers' schemas, generated from the code that writes them.
//!
//! An answer's shape is whatever its `json` function makes of a wire
//! message, so the schema is learned from that function itself: it is run
//! on messages made from the protocol's own descriptors with every field
//! set (twice, with different values), and on a sparse one (every list
//! with one bare element, nothing else set). Keys that differ between the
//! two full runs are data (a map keyed by wait class or error code); a
//! value null in the sparse run is nullable. `validate` then holds a live
//! answer to the schema, which is how the tests keep the two honest.
use prost::{
    Message,
    encoding::{WireType, encode_key, encode_varint},
};
use prost_types::{
    DescriptorProto, FileDescriptorSet,
    field_descriptor_proto::{Label, Type},
};
use serde_json::{Map, Value, json};

/// The protocol's descriptors, as the build compiled them.
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sqlbee_v1.bin"));

/// Nested messages deeper than this are left unset (recursive messages).
const MAX_DEPTH: usize = 6;

/// How an example message is filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Example {
    /// Every field set: numbers 7, strings "a", one element per list.
    Full,
    /// As `Full`, with other values: numbers 9, strings "b".
    Other,
    /// No scalar set; lists with one element; messages present down to
    /// this depth and unset below it (so each level's absent message is
    /// seen as its answer writes it).
    SparseBelow(usize),
}

impl Example {
    /// Every sparse example: a message absent at each depth in turn.
    pub fn sparse() -> impl Iterator<Item = Example> {
        (0..=MAX_DEPTH).map(Example::SparseBelow)
    }
}

/// `message` (`TopResponse`, a `sqlbee.v1` message) filled as `example`
/// says.
pub fn example<M: Message + Default>(message: &str, example: Example) -> M {
    let set = FileDescriptorSet::decode(DESCRIPTORS).expect("the build's descriptors decode");
    let mut bytes = Vec::new();
    encode_message(&set, message, example, 0, &mut bytes);
    M::decode(bytes.as_slice()).expect("an example message decodes")
}

fn find<'a>(set: &'a FileDescriptorSet, name: &str) -> &'a DescriptorProto {
    let name = name.trim_start_matches('.').trim_start_matches("sqlbee.v1.");
    let mut path = name.split('.');
    let top = path.next().unwrap_or_default();
    let mut found = set
        .file
        .iter()
        .flat_map(|f| f.message_type.iter())
        .find(|m| m.name() == top)
        .unwrap_or_else(|| panic!("no message {name} in sqlbee.v1"));
    for nested in path {
        found = found.nested_type.iter().find(|m| m.name() == nested).unwrap_or_else(|| panic!("no message {name}"));
    }
    found
}

fn encode_message(set: &FileDescriptorSet, name: &str, example: Example, depth: usize, out: &mut Vec<u8>) {
    let message = find(set, name);
    let (number, text) = match example {
        Example::Full => (7u64, "a"),
        Example::Other => (9u64, "b"),
        Example::SparseBelow(_) => (0, ""),
    };
    for field in &message.field {
        let tag = field.number() as u32;
        let repeated = field.label() == Label::Repeated;
        let message = matches!(field.r#type(), Type::Message | Type::Group);
        if let Example::SparseBelow(set_to) = example
            && !repeated
            && (!message || depth >= set_to)
        {
            continue;
        }
        match field.r#type() {
            Type::Message | Type::Group => {
                if depth >= MAX_DEPTH {
                    continue;
                }
                let mut nested = Vec::new();
                encode_message(set, field.type_name(), example, depth + 1, &mut nested);
                encode_key(tag, WireType::LengthDelimited, out);
                encode_varint(nested.len() as u64, out);
                out.extend_from_slice(&nested);
            }
            Type::String | Type::Bytes => {
                encode_key(tag, WireType::LengthDelimited, out);
                encode_varint(text.len() as u64, out);
                out.extend_from_slice(text.as_bytes());
            }
            Type::Double => {
                encode_key(tag, WireType::SixtyFourBit, out);
                out.extend_from_slice(&(number as f64 / 2.0).to_le_bytes());
            }
            Type::Float => {
                encode_key(tag, WireType::ThirtyTwoBit, out);
                out.extend_from_slice(&(number as f32 / 2.0).to_le_bytes());
            }
            Type::Fixed64 | Type::Sfixed64 => {
                encode_key(tag, WireType::SixtyFourBit, out);
                out.extend_from_slice(&number.to_le_bytes());
            }
            Type::Fixed32 | Type::Sfixed32 => {
                encode_key(tag, WireType::ThirtyTwoBit, out);
                out.extend_from_slice(&(number as u32).to_le_bytes());
            }
            Type::Sint32 | Type::Sint64 => {
                encode_key(tag, WireType::Varint, out);
                encode_varint(number << 1, out);
            }
            Type::Bool => {
                encode_key(tag, WireType::Varint, out);
                encode_varint(u64::from(number != 0), out);
            }
            Type::Int32 | Type::Int64 | Type::Uint32 | Type::Uint64 | Type::Enum => {
                encode_key(tag, WireType::Varint, out);
                encode_varint(number, out);
            }
        }
    }
}

/// The schema of the answers `answer` makes of the examples.
pub fn learned(answer: impl Fn(Example) -> Value) -> Value {
    let full = answer(Example::Full);
    let mut schema = shape(&full, &answer(Example::Other));
    for sparse in Example::sparse() {
        nullable(&mut schema, &full, &answer(sparse));
    }
    schema
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The shape two full answers share.
fn shape(a: &Value, b: &Value) -> Value {
    match (a, b) {
        (Value::Array(a), Value::Array(b)) => match (a.first(), b.first()) {
            (Some(x), y) => {
                let mut items = shape(x, y.unwrap_or(x));
                // Elements past the first may differ (a last row for the
                // rest, with null where the others have a value).
                for more in a.iter().chain(b.iter()).skip(1) {
                    widen(&mut items, more);
                }
                json!({ "type": "array", "items": items })
            }
            (None, Some(y)) => json!({ "type": "array", "items": shape(y, y) }),
            (None, None) => json!({ "type": "array" }),
        },
        (Value::Object(a), Value::Object(b)) if a.keys().eq(b.keys()) => {
            let properties: Map<String, Value> =
                a.iter().map(|(k, v)| (k.clone(), shape(v, b.get(k).unwrap_or(v)))).collect();
            let required: Vec<&String> = a.keys().collect();
            json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
        }
        // Keys made from the data: a map.
        (Value::Object(a), Value::Object(b)) => {
            let value = match (a.values().next(), b.values().next()) {
                (Some(x), Some(y)) => shape(x, y),
                (Some(x), None) | (None, Some(x)) => shape(x, x),
                (None, None) => json!({}),
            };
            json!({ "type": "object", "additionalProperties": value })
        }
        // 7 and 9 are integers, 3.5 and 4.5 numbers; an integer that is
        // sometimes a fraction is a number.
        (Value::Number(_), Value::Number(_)) if type_of(a) != type_of(b) => json!({ "type": "number" }),
        (Value::Null, Value::Null) => json!({ "type": "null" }),
        (Value::Null, other) | (other, Value::Null) => {
            let mut schema = shape(other, other);
            schema["type"] = json!([type_of(other), "null"]);
            schema
        }
        _ => json!({ "type": type_of(a) }),
    }
}

/// Lets `schema` take `value` where it is null.
fn widen(schema: &mut Value, value: &Value) {
    match value {
        Value::Null => {
            if let Some(kind) = schema["type"].as_str().map(str::to_string) {
                schema["type"] = json!([kind, "null"]);
            }
        }
        Value::Object(fields) => {
            for (key, v) in fields {
                if let Some(property) = schema.get_mut("properties").and_then(|p| p.get_mut(key)) {
                    widen(property, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get_mut("items") {
                items.iter().for_each(|v| widen(item, v));
            }
        }
        _ => {}
    }
}

/// Marks what the sparse answer leaves null (or a number where the full
/// one has a fraction: 0 is written as an integer).
fn nullable(schema: &mut Value, full: &Value, sparse: &Value) {
    match (full, sparse) {
        (_, Value::Null) if !full.is_null() => {
            let kind = schema["type"].clone();
            if let Some(kind) = kind.as_str() {
                schema["type"] = json!([kind, "null"]);
            }
        }
        (Value::Array(f), Value::Array(s)) => {
            if let (Some(f), Some(s), Some(items)) = (f.first(), s.first(), schema.get_mut("items")) {
                nullable(items, f, s);
            }
        }
        (Value::Object(f), Value::Object(s)) => {
            if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                for (key, property) in properties.iter_mut() {
                    if let (Some(f), Some(s)) = (f.get(key), s.get(key)) {
                        nullable(property, f, s);
                    }
                }
            } else if let (Some(values), Some(f), Some(s)) =
                (schema.get_mut("additionalProperties"), f.values().next(), s.values().next())
            {
                nullable(values, f, s);
            }
        }
        _ => {}
    }
}

/// Where `value` does not match `schema` (this module's subset: types,
/// items, properties, required, additionalProperties, anyOf), each as `path:
/// what`; empty when it matches.
pub fn validate(schema: &Value, value: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(schema, value, "$", &mut errors);
    errors
}

fn check(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if let Some(choices) = schema["anyOf"].as_array() {
        if !choices.iter().any(|choice| validate(choice, value).is_empty()) {
            errors.push(format!("{path}: matches none of the shapes the schema allows"));
        }
        return;
    }
    let actual = type_of(value);
    let allowed = |t: &str| t == actual || (t == "number" && actual == "integer");
    let fits = match &schema["type"] {
        Value::String(t) => allowed(t),
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).any(allowed),
        _ => true,
    };
    if !fits {
        errors.push(format!("{path}: {actual}, the schema says {}", schema["type"]));
        return;
    }
    match value {
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    check(item, v, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            for required in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                if !fields.contains_key(required) {
                    errors.push(format!("{path}: no {required:?}"));
                }
            }
            for (key, v) in fields {
                match (properties.and_then(|p| p.get(key)), schema.get("additionalProperties")) {
                    (Some(property), _) => check(property, v, &format!("{path}.{key}"), errors),
                    (None, Some(Value::Bool(false))) => errors.push(format!("{path}: {key:?} is not in the schema")),
                    (None, Some(values)) if values.is_object() => check(values, v, &format!("{path}.{key}"), errors),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{TopDigest, TopResponse};

    fn top(example_of: Example) -> Value {
        let answer: TopResponse = example("TopResponse", example_of);
        crate::json::top_json(&answer.digests)
    }

    #[test]
    fn examples_fill_every_field_or_only_lists() {
        let full: TopResponse = example("TopResponse", Example::Full);
        let d: &TopDigest = &full.digests[0];
        assert_eq!((d.count, d.digest_text.as_str(), d.waits.len()), (7, "a", 1));
        assert!(d.stats.as_ref().is_some_and(|s| s.rows_examined == Some(7)));
        let sparse: TopResponse = example("TopResponse", Example::SparseBelow(0));
        assert_eq!((sparse.digests.len(), sparse.digests[0].count, sparse.digests[0].stats.is_none()), (1, 0, true));
    }

    #[test]
    fn the_learned_schema_knows_maps_nulls_and_holds_its_own_examples() {
        let schema = learned(top);
        let row = &schema["items"];
        assert_eq!(row["additionalProperties"], false);
        assert_eq!(row["properties"]["count"]["type"], "integer");
        assert_eq!(row["properties"]["waits"]["additionalProperties"]["properties"]["sum_ns"]["type"], "integer");
        assert_eq!(row["properties"]["program"]["type"], json!(["string", "null"]));
        assert_eq!(row["properties"]["rows_examined"]["type"], json!(["integer", "null"]));
        for example_of in [Example::Full, Example::Other].into_iter().chain(Example::sparse()) {
            assert_eq!(validate(&schema, &top(example_of)), Vec::<String>::new());
        }
        let mut wrong = top(Example::Full);
        wrong[0]["count"] = json!("many");
        wrong[0]["surprise"] = json!(1);
        wrong[0].as_object_mut().unwrap().remove("digest");
        let errors = validate(&schema, &wrong);
        assert_eq!(errors.len(), 3, "{errors:?}");
    }
}
