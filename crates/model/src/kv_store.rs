//! The runner's paged KV store: every layer's keys and values in `n_blocks` blocks, in f32 or f16
//! ([`KvDtype`]); whole blocks copied out and back as bytes (the prefix cache's host and storage
//! tiers), and slots moved within a sequence (a draft tree's accepted path).

use crate::ModelError;
use kernels::attention::{KvDtype, KvElem, KvShape, f16, read_le, write_le};

/// Keys and values of every layer, layer after layer, each layer `n_blocks` blocks.
#[derive(Debug)]
pub(crate) struct Arrays<E> {
    pub keys: Vec<E>,
    pub values: Vec<E>,
}

/// The store, in the element type chosen at start.
#[derive(Debug)]
pub(crate) enum KvStore {
    F32(Arrays<f32>),
    F16(Arrays<f16>),
}

/// One layer's slice of a store of `E`.
pub(crate) struct KvSlices<'a, E> {
    pub keys: &'a mut [E],
    pub values: &'a mut [E],
    pub shape: KvShape,
}

/// One layer's slice of the store.
pub(crate) enum KvLayer<'a> {
    F32(KvSlices<'a, f32>),
    F16(KvSlices<'a, f16>),
}

impl KvLayer<'_> {
    pub fn shape(&self) -> KvShape {
        match self {
            KvLayer::F32(s) => s.shape,
            KvLayer::F16(s) => s.shape,
        }
    }
}

impl<E: KvElem> Arrays<E> {
    fn new(len: usize) -> Self {
        Self {
            keys: vec![E::default(); len],
            values: vec![E::default(); len],
        }
    }

    /// Block `block` of every layer (`stride` elements a block, `layer` a layer) into `out`:
    /// per layer its keys, then its values, little-endian.
    fn save(&self, block: usize, stride: usize, layer: usize, out: &mut [u8]) {
        let n = E::DTYPE.bytes();
        for (l, chunk) in out.chunks_exact_mut(2 * stride * n).enumerate() {
            let at = l * layer + block * stride;
            let (k, v) = chunk.split_at_mut(stride * n);
            write_le(&self.keys[at..at + stride], k);
            write_le(&self.values[at..at + stride], v);
        }
    }

    /// The inverse of [`Arrays::save`].
    fn load(&mut self, block: usize, stride: usize, layer: usize, data: &[u8]) {
        let n = E::DTYPE.bytes();
        for (l, chunk) in data.chunks_exact(2 * stride * n).enumerate() {
            let at = l * layer + block * stride;
            let (k, v) = chunk.split_at(stride * n);
            read_le(k, &mut self.keys[at..at + stride]);
            read_le(v, &mut self.values[at..at + stride]);
        }
    }

    /// Slot `from`'s keys and values into slot `to` (of the block table `blocks`), every layer.
    fn move_slot(&mut self, shape: KvShape, layer: usize, blocks: &[u32], from: usize, to: usize) {
        for l in 0..self.keys.len() / layer {
            let base = l * layer;
            for kvh in 0..shape.n_kv_heads {
                for d in 0..shape.head_dim {
                    self.keys[base + shape.key_index(blocks, to, kvh, d)] =
                        self.keys[base + shape.key_index(blocks, from, kvh, d)];
                }
            }
            let (src, dst) = (
                base + shape.value_index(blocks, from, 0, 0),
                base + shape.value_index(blocks, to, 0, 0),
            );
            self.values
                .copy_within(src..src + shape.token_stride(), dst);
        }
    }

    fn layer(&mut self, l: usize, layer: usize, shape: KvShape) -> KvSlices<'_, E> {
        KvSlices {
            keys: &mut self.keys[l * layer..(l + 1) * layer],
            values: &mut self.values[l * layer..(l + 1) * layer],
            shape,
        }
    }
}

/// A store of `n_layers` layers of `n_blocks` blocks shaped `shape`.
#[derive(Debug)]
pub(crate) struct PagedKv {
    pub shape: KvShape,
    pub n_blocks: usize,
    pub n_layers: usize,
    store: KvStore,
}

impl PagedKv {
    pub fn new(shape: KvShape, n_layers: usize, n_blocks: usize, dtype: KvDtype) -> Self {
        let len = n_layers * n_blocks * shape.block_stride();
        let store = match dtype {
            KvDtype::F32 => KvStore::F32(Arrays::new(len)),
            KvDtype::F16 => KvStore::F16(Arrays::new(len)),
        };
        Self {
            shape,
            n_blocks,
            n_layers,
            store,
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self.store {
            KvStore::F32(_) => KvDtype::F32,
            KvStore::F16(_) => KvDtype::F16,
        }
    }

    /// Bytes of the whole store.
    pub fn bytes(&self) -> usize {
        self.n_blocks * self.block_bytes()
    }

    /// Bytes of one block's keys and values over all layers.
    pub fn block_bytes(&self) -> usize {
        block_bytes(self.shape, self.n_layers, self.dtype())
    }

    /// Elements of one layer.
    fn layer_len(&self) -> usize {
        self.n_blocks * self.shape.block_stride()
    }

    /// Copies block `block`'s keys and values, every layer, into `out` ([`PagedKv::block_bytes`]
    /// long).
    pub fn save_block(&self, block: u32, out: &mut [u8]) -> Result<(), ModelError> {
        self.check_block(block, out.len())?;
        let (b, stride, layer) = (block as usize, self.shape.block_stride(), self.layer_len());
        match &self.store {
            KvStore::F32(a) => a.save(b, stride, layer, out),
            KvStore::F16(a) => a.save(b, stride, layer, out),
        }
        Ok(())
    }

    /// Writes a block saved by [`PagedKv::save_block`] back into block `block`.
    pub fn load_block(&mut self, block: u32, data: &[u8]) -> Result<(), ModelError> {
        self.check_block(block, data.len())?;
        let (b, stride, layer) = (block as usize, self.shape.block_stride(), self.layer_len());
        match &mut self.store {
            KvStore::F32(a) => a.load(b, stride, layer, data),
            KvStore::F16(a) => a.load(b, stride, layer, data),
        }
        Ok(())
    }

    fn check_block(&self, block: u32, len: usize) -> Result<(), ModelError> {
        if block as usize >= self.n_blocks || len != self.block_bytes() {
            return Err(ModelError::BadBatch(format!(
                "block {block} of {} with a buffer of {len} bytes (needs {})",
                self.n_blocks,
                self.block_bytes()
            )));
        }
        Ok(())
    }

    /// Copies the keys and values in slot `from` to slot `to` of the block table `blocks`, in
    /// every layer (the caller checked both slots lie in its blocks).
    pub fn move_slot(&mut self, blocks: &[u32], from: usize, to: usize) {
        let (shape, layer) = (self.shape, self.layer_len());
        match &mut self.store {
            KvStore::F32(a) => a.move_slot(shape, layer, blocks, from, to),
            KvStore::F16(a) => a.move_slot(shape, layer, blocks, from, to),
        }
    }

    /// Layer `l`'s slice.
    pub fn layer(&mut self, l: usize) -> KvLayer<'_> {
        let (shape, layer) = (self.shape, self.layer_len());
        match &mut self.store {
            KvStore::F32(a) => KvLayer::F32(a.layer(l, layer, shape)),
            KvStore::F16(a) => KvLayer::F16(a.layer(l, layer, shape)),
        }
    }
}

/// Bytes of one block's keys and values over `n_layers` layers.
pub(crate) fn block_bytes(shape: KvShape, n_layers: usize, dtype: KvDtype) -> usize {
    2 * n_layers * shape.block_stride() * dtype.bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> KvShape {
        KvShape {
            block_size: 4,
            n_kv_heads: 2,
            head_dim: 8,
        }
    }

    /// A store whose every key and value is distinct (and exact in f16).
    fn filled(dtype: KvDtype) -> PagedKv {
        let mut kv = PagedKv::new(shape(), 3, 5, dtype);
        let (bs, kvd) = (4, 16);
        let blocks: Vec<u32> = (0..5).collect();
        for l in 0..3 {
            let row = |pos: usize, f: f32| -> Vec<f32> {
                (0..kvd)
                    .map(|i| (l * 1000 + pos * 20 + i) as f32 * f)
                    .collect()
            };
            for pos in 0..5 * bs {
                let (k, v) = (row(pos, 0.5), row(pos, -0.25));
                match kv.layer(l) {
                    KvLayer::F32(s) => kernels::attention::write_kv(
                        s.keys, s.values, s.shape, &blocks, pos, &k, &v,
                    ),
                    KvLayer::F16(s) => kernels::attention::write_kv(
                        s.keys, s.values, s.shape, &blocks, pos, &k, &v,
                    ),
                }
            }
        }
        kv
    }

    #[test]
    fn blocks_round_trip_through_bytes_in_either_dtype() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let kv = filled(dtype);
            assert_eq!(kv.block_bytes(), 2 * 3 * 4 * 16 * dtype.bytes());
            assert_eq!(kv.bytes(), 5 * kv.block_bytes());
            let mut saved = vec![0u8; kv.block_bytes()];
            kv.save_block(3, &mut saved).unwrap();
            let mut other = PagedKv::new(shape(), 3, 5, dtype);
            other.load_block(1, &saved).unwrap();
            let mut again = vec![0u8; kv.block_bytes()];
            other.save_block(1, &mut again).unwrap();
            assert_eq!(saved, again, "{dtype}");
            assert!(kv.save_block(5, &mut saved).is_err(), "no block 5");
            assert!(other.load_block(0, &saved[1..]).is_err(), "a short buffer");
        }
    }

    #[test]
    fn a_moved_slot_carries_its_keys_and_values_in_every_layer() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut kv = filled(dtype);
            let blocks = [4u32, 2, 0];
            let block_of = |kv: &PagedKv, block: u32| {
                let mut b = vec![0u8; kv.block_bytes()];
                kv.save_block(block, &mut b).unwrap();
                b
            };
            let before = block_of(&kv, 2);
            kv.move_slot(&blocks, 1, 6);
            let after = block_of(&kv, 2);
            // Slot 6 is slot 2 of block 2; slot 1 is slot 1 of block 4. Per layer and per
            // half (keys, then values) of block 2, only slot 2's elements change, to slot 1's.
            assert_ne!(before, after, "{dtype}");
            let src = block_of(&kv, 4);
            let n = dtype.bytes();
            let s = shape();
            for l in 0..3 {
                let layer_at = l * 2 * s.block_stride() * n;
                for d in 0..s.token_stride() {
                    let key = |b: &[u8], slot: usize| {
                        let at = layer_at + (d * s.block_size + slot) * n;
                        b[at..at + n].to_vec()
                    };
                    let value = |b: &[u8], slot: usize| {
                        let at = layer_at + (s.block_stride() + slot * s.token_stride() + d) * n;
                        b[at..at + n].to_vec()
                    };
                    assert_eq!(key(&after, 2), key(&src, 1), "{dtype}: layer {l} key {d}");
                    assert_eq!(
                        value(&after, 2),
                        value(&src, 1),
                        "{dtype}: layer {l} value {d}"
                    );
                    assert_eq!(key(&after, 0), key(&before, 0));
                    assert_eq!(value(&after, 3), value(&before, 3));
                }
            }
        }
    }
}
