//! How the layers of `ServeArgs` become one: the flags over the config file over the defaults,
//! by one generic merge (no code per setting).

use super::ServeArgs;
use anyhow::{Context, anyhow};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};
use serde_json::{Map, Value};
use std::path::Path;

impl ServeArgs {
    /// The flags given on the command line: the values clap filled in from the declared defaults
    /// are dropped, so that the config file can still set them.
    pub fn from_command_line(matches: &ArgMatches) -> anyhow::Result<Self> {
        let parsed = Self::from_arg_matches(matches)?;
        let mut given = to_map(&parsed)?;
        // clap names each argument by its field, serde by the kebab-case key.
        given.retain(|key, _| {
            matches.value_source(&key.replace('-', "_")) == Some(ValueSource::CommandLine)
        });
        Ok(Self {
            config: parsed.config,
            ..from_map(given)?
        })
    }

    /// The declared defaults (`default_value`), as clap fills them in for no flags at all.
    pub fn defaults() -> Self {
        let command = Self::augment_args(clap::Command::new("serve"));
        let matches = command
            .try_get_matches_from(["serve"])
            .expect("no serve setting is required");
        Self::from_arg_matches(&matches).expect("the defaults parse")
    }

    /// The `--config` file's settings.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).map_err(|e| {
            // The line at fault names the key (the flag) the message is about.
            let line = e.span().and_then(|at| {
                let start = text[..at.start].rfind('\n').map_or(0, |i| i + 1);
                text[start..].lines().next().map(str::trim)
            });
            let line = line.filter(|l| !l.is_empty());
            match line {
                Some(line) => anyhow!("{}: `{line}`: {}", path.display(), e.message()),
                None => anyhow!("{}: {}", path.display(), e.message()),
            }
        })
    }
}

/// `layers` stacked, the first on top: each setting takes its value from the highest layer that
/// sets it. A layer does not set a `None` or a switch left `false` (a switch, `false` at the
/// bottom, can only be turned on; an optional boolean, `None` at the bottom, can be set either
/// way), except the bottom one, which holds the defaults. The result has every key of the
/// bottom layer, ready to be read as a typed view (`ServeConfig`).
pub fn stack(layers: &[&ServeArgs]) -> anyhow::Result<Value> {
    let (bottom, upper) = layers.split_last().expect("at least one layer");
    let mut merged = to_map(bottom)?;
    let switch_off = |key: &str, v: &Value| {
        *v == Value::Bool(false) && merged.get(key) == Some(&Value::Bool(false))
    };
    let mut set = Map::new();
    for layer in upper.iter().rev() {
        set.extend(
            to_map(layer)?
                .into_iter()
                .filter(|(k, v)| !(v.is_null() || switch_off(k, v))),
        );
    }
    merged.extend(set);
    Ok(Value::Object(merged))
}

fn to_map(layer: &ServeArgs) -> anyhow::Result<Map<String, Value>> {
    match serde_json::to_value(layer).context("serve settings")? {
        Value::Object(map) => Ok(map),
        other => unreachable!("settings serialize as a map, not {other}"),
    }
}

fn from_map(map: Map<String, Value>) -> anyhow::Result<ServeArgs> {
    serde_json::from_value(Value::Object(map)).context("serve settings")
}

/// Serde for a value enum by its flag spelling (as `--help` lists it; any case on input).
pub mod named {
    use super::*;

    pub fn serialize<T: ValueEnum, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        let name = v.to_possible_value().expect("no skipped variants");
        s.serialize_str(name.get_name())
    }

    pub fn deserialize<'de, T: ValueEnum, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        parse(&<String as serde::Deserialize>::deserialize(d)?)
    }

    pub(super) fn parse<T: ValueEnum, E: serde::de::Error>(name: &str) -> Result<T, E> {
        T::from_str(name, true).map_err(|_| {
            let names: Vec<String> = T::value_variants()
                .iter()
                .filter_map(|v| Some(v.to_possible_value()?.get_name().to_owned()))
                .collect();
            E::custom(format!("{name}: use one of {}", names.join(", ")))
        })
    }
}

/// Serde for a value by its flag spelling through `Display` and `FromStr` (a list such as
/// `EAGLE3,SUFFIX`).
pub mod parsed {
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr<Err = String>,
        D: serde::Deserializer<'de>,
    {
        let text = <String as serde::Deserialize>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `parsed` for an optional value.
pub mod opt_parsed {
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: serde::Serializer>(
        v: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => super::parsed::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr<Err = String>,
        D: serde::Deserializer<'de>,
    {
        let text = <Option<String> as serde::Deserialize>::deserialize(d)?;
        text.map(|t| t.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// `named` for an optional value.
pub mod opt_named {
    use super::*;

    pub fn serialize<T: ValueEnum, S: serde::Serializer>(
        v: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => named::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T: ValueEnum, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        let name = <Option<String> as serde::Deserialize>::deserialize(d)?;
        name.map(|n| named::parse(&n)).transpose()
    }
}
