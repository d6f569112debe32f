//! `--activations int16|int8` (`model::ActMode`): the one parser that `serve`, `generate`,
//! `model bench`, `demo` and the serve config file's `activations` key share. The default is
//! `ActMode::default()`, declared in the kernels crate and nowhere else.

use clap::Args;
use clap::builder::{PossibleValue, TypedValueParser};
use model::ActMode;

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

/// `--activations` for `generate`, `model bench` and `demo` (`serve` declares its own in
/// `ServeArgs`, as an optional layer).
#[derive(Args, Debug, Clone, Copy)]
pub struct ActivationsArg {
    /// Activation quantisation: int16 (exact to f32 rounding) or int8 (half the integer work of
    /// prompts and batched decode, GGML-like rounding).
    #[arg(long = "activations", value_parser = ActModeParser, default_value_t = ActMode::default())]
    pub mode: ActMode,
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
