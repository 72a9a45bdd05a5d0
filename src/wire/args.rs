use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use thiserror::Error;

/// Why a message's arguments do not fit the task's parameters. Never retried: the same message
/// would fail the same way.
#[derive(Debug, Clone, Error, PartialEq)]
#[non_exhaustive]
pub enum ArgumentError {
    /// More positional arguments than the task has parameters.
    #[error("{given} positional arguments given but the task takes {expected}")]
    TooManyPositional {
        /// Positional arguments in the message.
        given: usize,
        /// Parameters of the task.
        expected: usize,
    },
    /// A keyword argument that names no parameter.
    #[error("unexpected keyword argument `{0}`")]
    UnknownKeyword(String),
    /// A parameter given both by position and by keyword.
    #[error("argument `{0}` given both by position and by keyword")]
    Duplicate(String),
    /// A parameter given neither way (and it is not an `Option`).
    #[error("missing argument `{0}`")]
    Missing(String),
    /// A value that does not deserialize into the parameter's type.
    #[error("argument `{name}` has the wrong type: {reason}")]
    WrongType {
        /// The parameter.
        name: String,
        /// serde's explanation, without the value itself (arguments are user data: this text
        /// reaches logs, dead-letter headers and the stored result): `invalid type: string,
        /// expected i64`.
        reason: String,
    },
}

/// Binds `args`/`kwargs` to a task's parameters the way a Python call does: positional
/// arguments first, then keyword arguments by parameter name. Used by `#[task]`-generated code.
///
/// ```
/// use ferriq::wire::ArgumentBinder;
/// use serde_json::json;
/// let kwargs = json!({"b": 2}).as_object().unwrap().clone();
/// let mut bind = ArgumentBinder::new(vec![json!(1)], kwargs, &["a", "b"]).unwrap();
/// let a: i64 = bind.take(0).unwrap();
/// let b: i64 = bind.take(1).unwrap();
/// assert_eq!((a, b), (1, 2));
/// ```
#[derive(Debug)]
pub struct ArgumentBinder {
    values: Vec<Option<Value>>,
    params: &'static [&'static str],
}

impl ArgumentBinder {
    /// Matches arguments to `params`; fails on too many positionals, unknown keywords or a
    /// parameter given twice.
    pub fn new(
        args: Vec<Value>,
        mut kwargs: Map<String, Value>,
        params: &'static [&'static str],
    ) -> Result<Self, ArgumentError> {
        if args.len() > params.len() {
            return Err(ArgumentError::TooManyPositional {
                given: args.len(),
                expected: params.len(),
            });
        }
        let positional = args.len();
        let mut values: Vec<Option<Value>> = args.into_iter().map(Some).collect();
        for (i, name) in params.iter().enumerate().skip(positional) {
            values.push(kwargs.remove(*name));
            debug_assert_eq!(values.len(), i + 1);
        }
        if let Some(name) = params[..positional]
            .iter()
            .find(|n| kwargs.contains_key(**n))
        {
            return Err(ArgumentError::Duplicate((*name).to_owned()));
        }
        if let Some(name) = kwargs.keys().next() {
            return Err(ArgumentError::UnknownKeyword(name.clone()));
        }
        Ok(ArgumentBinder { values, params })
    }

    /// Deserializes parameter `index`. A missing parameter reads as JSON `null`, so an `Option`
    /// parameter defaults to `None` and any other type reports it missing.
    pub fn take<T: DeserializeOwned>(&mut self, index: usize) -> Result<T, ArgumentError> {
        let name = self.params.get(index).copied().unwrap_or("?");
        match self.values.get_mut(index).and_then(Option::take) {
            Some(v) => serde_json::from_value(v).map_err(|e| ArgumentError::WrongType {
                name: name.to_owned(),
                reason: without_value(&e.to_string()),
            }),
            None => serde_json::from_value(Value::Null)
                .map_err(|_| ArgumentError::Missing(name.to_owned())),
        }
    }
}

/// The kinds serde names an unexpected value by (`serde::de::Unexpected`'s `Display`), longest
/// first where one starts another.
const UNEXPECTED_KINDS: [&str; 16] = [
    "floating point",
    "integer",
    "string",
    "boolean",
    "character",
    "byte array",
    "unit value",
    "Option value",
    "newtype struct",
    "sequence",
    "map",
    "enum",
    "unit variant",
    "newtype variant",
    "tuple variant",
    "struct variant",
];

/// serde's error text with the offending value left out: `invalid type: string "4111 1111",
/// expected i64` becomes `invalid type: string, expected i64`, `unknown variant `x`, expected
/// one of …` becomes `unknown variant, expected one of …`. Other texts (a type's own
/// `Deserialize` message) are kept as they are.
fn without_value(reason: &str) -> String {
    // serde writes the value, then ", expected …": the last occurrence is serde's own.
    let expected = reason.rfind(", expected ").map(|at| &reason[at..]);
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = reason.strip_prefix(prefix) {
            let kind = UNEXPECTED_KINDS
                .iter()
                .find(|k| rest.starts_with(**k))
                .copied()
                .unwrap_or("value");
            return format!("{prefix}{kind}{}", expected.unwrap_or_default());
        }
    }
    if reason.starts_with("unknown variant ") {
        return format!("unknown variant{}", expected.unwrap_or_default());
    }
    reason.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reason<T: DeserializeOwned + std::fmt::Debug>(value: Value) -> String {
        let mut bind = ArgumentBinder::new(vec![value], Map::new(), &["card"]).unwrap();
        match bind.take::<T>(0) {
            Err(ArgumentError::WrongType { reason, .. }) => reason,
            other => panic!("expected WrongType, got {other:?}"),
        }
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    enum Plan {
        Free,
        Pro,
    }

    #[test]
    fn a_wrong_type_never_quotes_the_value() {
        assert_eq!(
            reason::<i64>(json!("4111 1111, expected 1111")),
            "invalid type: string, expected i64"
        );
        assert_eq!(
            reason::<u8>(json!(-41111111)),
            "invalid value: integer, expected u8"
        );
        assert_eq!(
            reason::<String>(json!(4111.5)),
            "invalid type: floating point, expected a string"
        );
        assert_eq!(
            reason::<Plan>(json!("Secret-Tier")),
            "unknown variant, expected `Free` or `Pro`"
        );
        assert_eq!(
            reason::<Vec<i64>>(json!({"card": 4111})),
            "invalid type: map, expected a sequence"
        );
    }
}
