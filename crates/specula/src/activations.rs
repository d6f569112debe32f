//! `--activations int16|int8` (`model::ActMode`): the one parser that `serve`, `generate`,
//! `model bench`, `demo` and the serve config file's `activations` key share. The default is
//! `ActMode::default()`, declared in the kernels crate and nowhere else. Beside it,
//! `--kv-cache-dtype auto|f32|f16` (SGLang's flag), what the KV store holds.

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, ValueEnum};
use model::{ActMode, KvDtype, Model};

/// A mode by name, in any case (as the value-enum flags take theirs); the error names the allowed
/// values.
pub fn parse(name: &str) -> Result<ActMode, String> {
    name.parse()
        .or_else(|e| name.to_ascii_lowercase().parse().map_err(|_| e))
}

/// clap's parser for `--activations`: [`parse`], with the names listed in `--help`.
#[derive(Debug, Clone, Copy)]
pub struct ActModeParser;

impl TypedValueParser for ActModeParser {
    type Value = ActMode;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<ActMode, clap::Error> {
        // One `error:` line that names the flag and, through `parse`, the allowed values.
        parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            ActMode::ALL
                .into_iter()
                .map(|m| PossibleValue::new(m.name())),
        ))
    }
}

/// `--kv-cache-dtype`: what the KV store holds (`auto`, SGLang's default name, is f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvCacheDtype {
    #[value(alias = "auto")]
    F32,
    F16,
}

impl KvCacheDtype {
    pub fn dtype(self) -> KvDtype {
        match self {
            KvCacheDtype::F32 => KvDtype::F32,
            KvCacheDtype::F16 => KvDtype::F16,
        }
    }

    /// The flag's default: the runtime's ([`KvDtype::default`]), named as the flag names it.
    pub fn default_name() -> &'static str {
        KvDtype::default().name()
    }
}

/// `--activations` and `--kv-cache-dtype` for `generate`, `model bench` and `demo` (`serve`
/// declares its own in `ServeArgs`, as optional layers).
#[derive(Args, Debug, Clone, Copy)]
pub struct ActivationsArg {
    /// Activation quantisation: int16 (exact to f32 rounding) or int8 (half the integer work of
    /// prompts and batched decode, GGML-like rounding).
    #[arg(long = "activations", value_parser = ActModeParser, default_value_t = ActMode::default())]
    pub mode: ActMode,
    /// What the KV cache holds: f32, or f16 (half its memory and of the bytes each decode
    /// step reads, as llama.cpp stores it; adds to int8's error: see docs/runtime.md).
    #[arg(long, value_enum, ignore_case = true, default_value = KvCacheDtype::default_name())]
    pub kv_cache_dtype: KvCacheDtype,
}

impl ActivationsArg {
    /// Sets both on `model` (before any runner is made for it).
    pub fn apply(&self, model: &mut Model) {
        model.activations = self.mode;
        model.kv_cache_dtype = self.kv_cache_dtype.dtype();
    }
}

/// Serde for an optional mode by name (the serve layers' `activations` key).
pub mod opt_named {
    use super::*;

    pub fn serialize<S: serde::Serializer>(v: &Option<ActMode>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(mode) => s.serialize_str(mode.name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<ActMode>, D::Error> {
        let name = <Option<String> as serde::Deserialize>::deserialize(d)?;
        name.map(|n| parse(&n).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Serde for a mode by name (`ServeConfig`, and so `/server_info`'s `config.activations`).
pub mod named {
    use super::*;

    pub fn serialize<S: serde::Serializer>(v: &ActMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ActMode, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(d)?;
        parse(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        activations: ActivationsArg,
    }

    #[test]
    fn the_flag_parses_every_mode_and_defaults_to_the_kernels_default() {
        for mode in ActMode::ALL {
            let cli = Cli::try_parse_from(["x", "--activations", mode.name()]).unwrap();
            assert_eq!(cli.activations.mode, mode);
        }
        let cli = Cli::try_parse_from(["x", "--activations", "INT8"]).unwrap();
        assert_eq!(cli.activations.mode, ActMode::Int8);
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.activations.mode, ActMode::default());
    }

    #[test]
    fn a_bad_mode_is_one_line_naming_the_flag_and_the_modes() {
        let e = Cli::try_parse_from(["x", "--activations", "fp8"])
            .err()
            .unwrap()
            .to_string();
        let line = e.lines().next().unwrap();
        assert!(
            line.contains("--activations") && line.contains("int16 or int8"),
            "{e}"
        );
        assert_eq!(e.lines().filter(|l| l.starts_with("error:")).count(), 1);
    }
}
