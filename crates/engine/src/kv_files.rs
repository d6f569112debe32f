//! The prefix cache's storage tier: one file per KV block in a directory
//! (`--hicache-storage-dir`), named by the block's path key (`kvcache::path_key`, a hash of
//! every token up to the block's end), so a restarted server finds its prefixes again.
//!
//! A file holds a header (magic, the model's fingerprint, the block's whole token path) and the
//! block's keys and values as the runner saves them (its KV store's dtype, little-endian; the
//! fingerprint names the dtype). Files of another model, dtype or layout are ignored, never read
//! into the cache. Files are written to a temporary name and renamed, so a crash leaves no
//! half-written block under a real name.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 10] = b"SPECULAKV2";

/// The drafter's memory of earlier requests: its file in the directory, and that file's first
/// bytes.
const DRAFTER_FILE: &str = "drafter.mem";
const DRAFTER_MAGIC: &[u8; 10] = b"SPECULADM1";

pub(crate) struct KvFiles {
    dir: PathBuf,
    fingerprint: String,
    bytes: usize,
}

impl KvFiles {
    /// The directory (created if missing) for blocks of `bytes` bytes of the model (and KV
    /// dtype) `fingerprint` names.
    pub(crate) fn open(dir: &Path, fingerprint: &str, bytes: usize) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            fingerprint: fingerprint.to_string(),
            bytes,
        })
    }

    fn path(&self, key: u64) -> PathBuf {
        self.dir.join(format!("{key:016x}.kv"))
    }

    pub(crate) fn write(&self, key: u64, tokens: &[u32], data: &[u8]) -> io::Result<()> {
        assert_eq!(data.len(), self.bytes, "a whole block");
        let mut bytes = Vec::with_capacity(64 + 4 * tokens.len() + data.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(self.fingerprint.len() as u32).to_le_bytes());
        bytes.extend_from_slice(self.fingerprint.as_bytes());
        bytes.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        bytes.extend_from_slice(&(data.len() as u64).to_le_bytes());
        bytes.extend_from_slice(data);
        let tmp = self.dir.join(format!("{key:016x}.kv.tmp"));
        fs::File::create(&tmp)?.write_all(&bytes)?;
        fs::rename(tmp, self.path(key))
    }

    /// The header of a file: its token path, if the file is this model's and whole.
    fn header(&self, r: &mut impl Read) -> io::Result<Option<Vec<u32>>> {
        let mut magic = [0u8; 10];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Ok(None);
        }
        let n = read_u32(r)? as usize;
        if n != self.fingerprint.len() {
            return Ok(None);
        }
        let mut fp = vec![0u8; n];
        r.read_exact(&mut fp)?;
        if fp != self.fingerprint.as_bytes() {
            return Ok(None);
        }
        let n = read_u32(r)? as usize;
        let mut tokens = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            tokens.push(read_u32(r)?);
        }
        let mut len = [0u8; 8];
        r.read_exact(&mut len)?;
        Ok((u64::from_le_bytes(len) == self.bytes as u64).then_some(tokens))
    }

    /// Reads block `key`, whose path must be `tokens`, into `out`.
    pub(crate) fn read(&self, key: u64, tokens: Option<&[u32]>, out: &mut [u8]) -> io::Result<()> {
        let mut r = io::BufReader::new(fs::File::open(self.path(key))?);
        let Some(found) = self.header(&mut r)? else {
            return Err(io::Error::other("not a block of this model"));
        };
        if tokens.is_some_and(|t| t != found) {
            return Err(io::Error::other("the file holds another prefix"));
        }
        r.read_exact(out)
    }

    /// Writes what `spec`'s drafter remembers of earlier requests (SUFFIX's cache) beside the
    /// blocks, for this model; whether there was anything to write.
    pub(crate) fn save_drafter(&self, spec: &speculative::Speculator) -> io::Result<bool> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(DRAFTER_MAGIC);
        bytes.extend_from_slice(&(self.fingerprint.len() as u32).to_le_bytes());
        bytes.extend_from_slice(self.fingerprint.as_bytes());
        if !spec.save(&mut bytes)? {
            return Ok(false);
        }
        let tmp = self.dir.join(format!("{DRAFTER_FILE}.tmp"));
        fs::File::create(&tmp)?.write_all(&bytes)?;
        fs::rename(tmp, self.dir.join(DRAFTER_FILE))?;
        Ok(true)
    }

    /// Gives `spec`'s drafter back what [`KvFiles::save_drafter`] wrote for this model, if
    /// anything (another model's file is left alone); `vocab` bounds its token ids.
    pub(crate) fn restore_drafter(
        &self,
        spec: &mut speculative::Speculator,
        vocab: usize,
    ) -> io::Result<bool> {
        let file = match fs::File::open(self.dir.join(DRAFTER_FILE)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let mut r = io::BufReader::new(file);
        let mut magic = [0u8; 10];
        r.read_exact(&mut magic)?;
        let n = read_u32(&mut r)? as usize;
        if &magic != DRAFTER_MAGIC || n != self.fingerprint.len() {
            return Ok(false);
        }
        let mut fp = vec![0u8; n];
        r.read_exact(&mut fp)?;
        if fp != self.fingerprint.as_bytes() {
            return Ok(false);
        }
        spec.restore(&mut r, vocab)?;
        Ok(true)
    }

    /// The token paths of this model's stored blocks, shortest first (so parents come before
    /// their children); unreadable and foreign files are skipped.
    pub(crate) fn list(&self) -> Vec<Vec<u32>> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut paths: Vec<Vec<u32>> = entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "kv"))
            .filter_map(|e| {
                let mut r = io::BufReader::new(fs::File::open(e.path()).ok()?);
                self.header(&mut r).ok().flatten()
            })
            .collect();
        paths.sort_by_key(Vec::len);
        paths
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_foreign_files_are_ignored() {
        let dir = std::env::temp_dir().join(format!("specula-kv-files-{}", std::process::id()));
        let files = KvFiles::open(&dir, "model-a", 4).unwrap();
        files.write(7, &[1, 2], &[5, 0, 255, 3]).unwrap();
        files.write(9, &[1, 2, 3, 4], &[1; 4]).unwrap();
        let mut out = [0; 4];
        files.read(7, Some(&[1, 2]), &mut out).unwrap();
        assert_eq!(out, [5, 0, 255, 3]);
        assert!(
            files.read(7, Some(&[1, 3]), &mut out).is_err(),
            "another prefix"
        );
        assert_eq!(files.list(), vec![vec![1, 2], vec![1, 2, 3, 4]]);
        let other = KvFiles::open(&dir, "model-b", 4).unwrap();
        assert!(other.list().is_empty());
        assert!(other.read(7, None, &mut out).is_err());
        fs::remove_dir_all(dir).unwrap();
    }
}
