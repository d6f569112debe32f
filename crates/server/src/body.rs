//! A request body as a JSON object, with typed getters that name the parameter in their errors.

use crate::error::ApiError;
use serde_json::{Map, Value};

pub(crate) struct Body(pub Map<String, Value>);

impl Body {
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => Ok(Self(map)),
            Ok(_) => Err(ApiError::bad_request(
                "the request body must be a JSON object",
            )),
            Err(e) => Err(ApiError::bad_request(format!(
                "the request body is not valid JSON: {e}"
            ))),
        }
    }

    /// A field, `null` counting as absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid(key, format!("`{key}` must be a boolean"))),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid(key, format!("`{key}` must be a string"))),
        }
    }

    /// A number within `lo..=hi` (`open_lo`: excluding `lo`).
    pub fn number(
        &self,
        key: &str,
        lo: f64,
        hi: f64,
        open_lo: bool,
    ) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let x = v
            .as_f64()
            .ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be a number")))?;
        let above = if open_lo { x > lo } else { x >= lo };
        if !(above && x <= hi) {
            let range = if open_lo {
                format!("in ({lo}, {hi}]")
            } else {
                format!("between {lo} and {hi}")
            };
            return Err(ApiError::invalid(
                key,
                format!("`{key}` must be {range}, got {x}"),
            ));
        }
        Ok(Some(x))
    }

    /// An integer within `lo..=hi`.
    pub fn integer(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let x = v
            .as_i64()
            .ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be an integer")))?;
        if x < lo || x > hi {
            return Err(ApiError::invalid(
                key,
                format!("`{key}` must be between {lo} and {hi}, got {x}"),
            ));
        }
        Ok(Some(x))
    }
}
