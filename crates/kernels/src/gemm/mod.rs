//! Matrix products of quantised weights with a batch of activations: `out[m][n] = Σ_k x[m][k] ·
//! W[n][k]`. Weights stay in their GGUF blocks and are read once per tile of batch rows.
//!
//! Batch invariance: every output element is the same sequence of block dot products summed in
//! the same order, whatever the batch size or tiling, so a sequence's logits do not depend on
//! what it is batched with.

mod driver;
#[cfg(target_arch = "x86_64")]
mod float;
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
#[cfg(target_arch = "x86_64")]
mod packed_avx512;

pub use packed::{PANEL, PackedKind, PackedMatrix};

use rayon::prelude::*;
use std::sync::OnceLock;

use crate::quant::{
    ACT_BLOCK, ActMode, BlockQ8Pair, BlockQ16, GgmlType, QuantError, quantize_row,
    quantize_row_pairs,
};

/// A weight matrix: `rows` output features, each `cols` values stored as `dtype` blocks, and
/// optionally the same weights in the AVX-512 kernels' panel layout.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    row_bytes: usize,
    packed: Option<&'a PackedMatrix>,
}

impl<'a> QMatrix<'a> {
    pub fn new(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, QuantError> {
        let row_bytes = dtype.bytes_for(cols);
        let total = row_bytes.and_then(|r| r.checked_mul(rows));
        match (row_bytes, total) {
            _ if dtype.is_integer() => Err(QuantError::NotWeights(dtype)),
            (Some(row_bytes), Some(total))
                if total == data.len() && cols.is_multiple_of(ACT_BLOCK) =>
            {
                Ok(Self {
                    dtype,
                    rows,
                    cols,
                    data,
                    row_bytes,
                    packed: None,
                })
            }
            _ => Err(QuantError::SizeMismatch {
                dtype,
                bytes: data.len(),
                values: rows * cols,
            }),
        }
    }

    /// The same matrix with its packed form, which products use where the CPU has AVX-512.
    pub fn with_packed(mut self, packed: &'a PackedMatrix) -> Self {
        assert_eq!(
            (packed.rows, packed.cols),
            (self.rows, self.cols),
            "packed form of another matrix"
        );
        self.packed = Some(packed);
        self
    }

    pub fn row(&self, n: usize) -> &'a [u8] {
        &self.data[n * self.row_bytes..(n + 1) * self.row_bytes]
    }
}

/// A batch of `m` activation rows of `k` values, kept both as f32 and quantised at `mode`'s
/// precision: integer products where the weight type has one, f32 products for the others.
#[derive(Debug, Default, Clone)]
pub struct Activations {
    /// How [`Activations::set`] quantises; the owner chooses it (`--activations`).
    pub mode: ActMode,
    pub m: usize,
    pub k: usize,
    /// The rows as given (not kept where `skip_f32` is set and byte pairs are made).
    pub f32: Vec<f32>,
    pub q16: Vec<BlockQ16>,
    /// `q16` as byte pairs, for packed weights (made where packed kernels run: AVX2 and up).
    pub pairs: Vec<BlockQ8Pair>,
    /// Set by an owner whose weights are all packed: where byte pairs are made, `set` then skips
    /// the f32 copy, which only products of unpacked weights read (a copy of every layer input,
    /// ~4% of a batched decode step).
    pub skip_f32: bool,
    /// Whether `f32` holds the rows of the last `set`.
    has_f32: bool,
}

impl Activations {
    /// Loads `x` (`m × k`, row-major), reusing the buffers; large batches quantise in parallel.
    pub fn set(&mut self, x: &[f32], m: usize, k: usize) {
        assert_eq!(x.len(), m * k, "activations must be m × k");
        assert!(k.is_multiple_of(ACT_BLOCK), "k must be a multiple of 32");
        self.m = m;
        self.k = k;
        let per = k / ACT_BLOCK;
        self.f32.resize(m * k, 0.0);
        self.q16.resize(m * per, BlockQ16::default());
        // Byte pairs are what the packed kernels read.
        let with_pairs = isa() >= Isa::Avx2;
        let copy = !(with_pairs && self.skip_f32);
        self.has_f32 = copy;
        let mode = self.mode;
        self.pairs
            .resize(if with_pairs { m * per } else { 0 }, BlockQ8Pair::default());
        // Rows `x` into `f`, `q` and (when made) `p`.
        let fill = |x: &[f32], f: &mut [f32], q: &mut [BlockQ16], p: &mut [BlockQ8Pair]| {
            if copy {
                f.copy_from_slice(x);
            }
            for (i, (row, blocks)) in x.chunks_exact(k).zip(q.chunks_exact_mut(per)).enumerate() {
                if with_pairs {
                    quantize_row_pairs(row, blocks, &mut p[i * per..(i + 1) * per], mode);
                } else {
                    quantize_row(row, blocks, mode);
                }
            }
        };
        let rows_per_task = (PARALLEL_MIN_WORK / k).max(1);
        if m <= rows_per_task || rayon::current_num_threads() <= 1 {
            fill(x, &mut self.f32, &mut self.q16, &mut self.pairs);
            return;
        }
        let (xs, fs) = (
            x.par_chunks(rows_per_task * k),
            self.f32.par_chunks_mut(rows_per_task * k),
        );
        let qs = self.q16.par_chunks_mut(rows_per_task * per);
        if with_pairs {
            let ps = self.pairs.par_chunks_mut(rows_per_task * per);
            xs.zip(fs)
                .zip(qs)
                .zip(ps)
                .for_each(|(((x, f), q), p)| fill(x, f, q, p));
        } else {
            xs.zip(fs)
                .zip(qs)
                .for_each(|((x, f), q)| fill(x, f, q, &mut []));
        }
    }

    pub fn row_f32(&self, i: usize) -> &[f32] {
        assert!(
            self.has_f32,
            "activations set without their f32 copy (skip_f32)"
        );
        &self.f32[i * self.k..(i + 1) * self.k]
    }

    pub fn row_q16(&self, i: usize) -> &[BlockQ16] {
        let per = self.k / ACT_BLOCK;
        &self.q16[i * per..(i + 1) * per]
    }

    pub fn row_pairs(&self, i: usize) -> &[BlockQ8Pair] {
        let per = self.k / ACT_BLOCK;
        &self.pairs[i * per..(i + 1) * per]
    }
}

/// The instruction set the kernels use, chosen once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Portable,
    Avx2,
    /// AVX2 with AVX-VNNI (256-bit `vpdpbusd`): most recent laptop and desktop CPUs.
    AvxVnni,
    Avx512,
}

impl Isa {
    /// From the best to the least.
    const BEST_FIRST: [Isa; 4] = [Isa::Avx512, Isa::AvxVnni, Isa::Avx2, Isa::Portable];

    /// Whether this CPU runs this path's kernels (an AVX-512 CPU need not have AVX-VNNI).
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = || {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            };
            match self {
                Isa::Portable => true,
                Isa::Avx2 => avx2(),
                Isa::AvxVnni => avx2() && is_x86_feature_detected!("avxvnni"),
                Isa::Avx512 => {
                    avx2()
                        && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// The best this CPU supports.
    pub fn detect() -> Self {
        Self::at_most(Isa::Avx512)
    }

    /// The best available path no better than `self`.
    fn at_most(self) -> Self {
        Self::BEST_FIRST
            .into_iter()
            .find(|i| *i <= self && i.available())
            .unwrap_or(Isa::Portable)
    }
}

/// The kernels' instruction set: the best detected, or lower if `SPECULA_KERNELS` asks
/// (`portable`, `avx2`, `avxvnni`, `avx512`; a request for a path the CPU lacks gets the best
/// it has below that).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let asked = match std::env::var("SPECULA_KERNELS").as_deref() {
            Err(_) | Ok("") | Ok("avx512") => Isa::Avx512,
            Ok("portable") => Isa::Portable,
            Ok("avx2") => Isa::Avx2,
            Ok("avxvnni") => Isa::AvxVnni,
            Ok(other) => {
                eprintln!(
                    "warning: SPECULA_KERNELS={other} is not portable, avx2, avxvnni or avx512; using the best this CPU has"
                );
                Isa::Avx512
            }
        };
        asked.at_most()
    })
}

/// How a product with one weight type runs: what `specula model info` reports per tensor type.
/// Built from the same predicates the driver dispatches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProductPath {
    /// Repacked at load into 16-row panels, integer SIMD over them (`vpdpbusd` with AVX-512
    /// VNNI, `vpmaddubsw` with AVX2).
    Packed,
    /// Float weights (F16, BF16, F32) in the file's rows, f32 SIMD multiply-adds.
    FloatRows,
    /// Scalar integer row dots from the GGUF blocks.
    ScalarRowDots,
    /// Each weight row dequantised to f32, then f32 dots (the slow path).
    Dequantised,
}

impl std::fmt::Display for ProductPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Packed => "repacked into 16-row panels (integer SIMD)",
            Self::FloatRows => "float rows as stored, f32 SIMD multiply-adds",
            Self::ScalarRowDots => "scalar integer row dots from GGUF blocks",
            Self::Dequantised => "dequantised to f32 row by row (slow)",
        })
    }
}

/// The path a product with `dtype` weights takes on `isa` (the weights being packed at load
/// wherever a packed form exists, as the model loader does).
pub fn product_path(dtype: GgmlType, isa: Isa) -> ProductPath {
    if packs(dtype, isa) {
        return ProductPath::Packed;
    }
    #[cfg(target_arch = "x86_64")]
    if float::multiplies(dtype) && isa >= Isa::Avx2 {
        return ProductPath::FloatRows;
    }
    if !driver::integer_product(dtype) {
        return ProductPath::Dequantised;
    }
    ProductPath::ScalarRowDots
}

/// Whether products with `dtype` weights run on packed panels on `isa`: the model loader packs
/// exactly these (every type with a packed form, wherever there is AVX2).
pub fn packs(dtype: GgmlType, isa: Isa) -> bool {
    PackedKind::of(dtype).is_some() && isa >= Isa::Avx2
}

/// Below this many multiply-adds a product runs on the calling thread alone.
const PARALLEL_MIN_WORK: usize = 1 << 17;

/// `out (m × rows) = x · Wᵀ`, split over the thread pool by weight rows.
pub fn gemm(w: &QMatrix<'_>, x: &Activations, out: &mut [f32]) {
    gemm_many(&mut [(*w, out)], x);
}

/// Several products of the same activations (Q, K and V; gate and up) in one parallel region:
/// half the fork-joins per layer, and the small ones get split too. Each output element is
/// computed exactly as [`gemm`] computes it.
pub fn gemm_many(products: &mut [(QMatrix<'_>, &mut [f32])], x: &Activations) {
    let isa = isa();
    let threads = rayon::current_num_threads();
    let mut work = 0;
    for (w, out) in products.iter() {
        assert_eq!(x.k, w.cols, "inner dimensions differ");
        assert_eq!(out.len(), x.m * w.rows, "output must be m × rows");
        work += w.rows * x.m * w.cols;
    }
    let outs: Vec<(QMatrix<'_>, OutPtr<'_>)> = products
        .iter_mut()
        .map(|(w, out)| (*w, OutPtr::new(out)))
        .collect();
    if threads <= 1 || work < PARALLEL_MIN_WORK {
        for (w, out) in &outs {
            driver::gemm(isa, w, x, out, 0..w.rows);
        }
        return;
    }
    // A few chunks per thread and product even out the load; each chunk is whole row tiles
    // and whole panels.
    let tasks: Vec<(usize, std::ops::Range<usize>)> = outs
        .iter()
        .enumerate()
        .flat_map(|(i, (w, _))| {
            let chunk = w.rows.div_ceil(threads * 4).next_multiple_of(PANEL);
            (0..w.rows.div_ceil(chunk)).map(move |c| (i, c * chunk..((c + 1) * chunk).min(w.rows)))
        })
        .collect();
    tasks.into_par_iter().for_each(|(i, rows)| {
        let (w, out) = &outs[i];
        driver::gemm(isa, w, x, out, rows);
    });
}

/// The output matrix shared by the threads of one product. Each thread computes a disjoint run
/// of weight rows and writes only those rows' columns, so no element is written twice; the
/// lifetime ties the pointer to the borrowed slice.
struct OutPtr<'a> {
    ptr: *mut f32,
    len: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: see `write`: concurrent writers touch disjoint elements.
unsafe impl Send for OutPtr<'_> {}
// SAFETY: as for `Send`: shared use only ever writes disjoint elements.
unsafe impl Sync for OutPtr<'_> {}

impl<'a> OutPtr<'a> {
    fn new(out: &'a mut [f32]) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _out: std::marker::PhantomData,
        }
    }

    /// Writes element `i`.
    ///
    /// # Safety
    /// No other thread may write or read element `i` during the product: callers write only the
    /// columns of the weight rows they were given, and the row ranges of one product are disjoint.
    unsafe fn write(&self, i: usize, v: f32) {
        assert!(i < self.len, "output index out of range");
        // SAFETY: in bounds (checked), exclusive by the caller's contract.
        unsafe { *self.ptr.add(i) = v }
    }

    /// Writes elements `i..i + values.len()`.
    ///
    /// # Safety
    /// As for [`OutPtr::write`], for each element.
    unsafe fn write_run(&self, i: usize, values: &[f32]) {
        assert!(i + values.len() <= self.len, "output run out of range");
        let (from, to) = (values.as_ptr(), self.ptr.wrapping_add(i));
        // SAFETY: in bounds (checked), exclusive by the caller's contract; `values` is a
        // different allocation from the output. A whole panel's or half panel's run is copied
        // with a constant length: a vector store, where a variable one calls `memmove`.
        unsafe {
            match values.len() {
                16 => std::ptr::copy_nonoverlapping(from, to, 16),
                8 => std::ptr::copy_nonoverlapping(from, to, 8),
                n => std::ptr::copy_nonoverlapping(from, to, n),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::dequantize;
    use half::f16;

    /// Pseudo-random bytes for weight blocks, with sane f16 scales in the right places.
    pub(crate) fn random_weights(dtype: GgmlType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761).max(1);
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let mut bytes: Vec<u8> = (0..dtype.bytes_for(rows * cols).unwrap())
            .map(|_| next() as u8)
            .collect();
        let scale_fields: &[usize] = match dtype {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            GgmlType::Q3_K => &[108],
            GgmlType::Q2_K => &[80, 82],
            _ => &[],
        };
        for block in bytes.chunks_exact_mut(dtype.type_size()) {
            for &at in scale_fields {
                let v = (next() % 2000) as f32 / 2000.0 * 0.02 - 0.01;
                block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        bytes
    }

    fn acts(m: usize, k: usize) -> Vec<f32> {
        (0..m * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 5) as f32))
            .collect()
    }

    #[test]
    fn every_type_agrees_with_an_f64_product_of_dequantised_weights() {
        let (rows, cols, m) = (9, 512, 3);
        for dtype in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::Q2_K,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
        ] {
            let bytes = random_weights(dtype, rows, cols, 7);
            let w = QMatrix::new(dtype, rows, cols, &bytes).unwrap();
            let x = acts(m, cols);
            let mut a = Activations::default();
            a.set(&x, m, cols);
            let mut out = vec![0.0; m * rows];
            gemm(&w, &a, &mut out);
            let mut wf = vec![0.0; rows * cols];
            dequantize(dtype, &bytes, &mut wf).unwrap();
            for i in 0..m {
                for n in 0..rows {
                    let exact: f64 = (0..cols)
                        .map(|k| x[i * cols + k] as f64 * wf[n * cols + k] as f64)
                        .sum();
                    let mag: f64 = (0..cols)
                        .map(|k| (x[i * cols + k] as f64 * wf[n * cols + k] as f64).abs())
                        .sum();
                    let got = out[i * rows + n] as f64;
                    assert!(
                        (got - exact).abs() <= 0.01 * mag + 1e-6,
                        "{dtype} [{i},{n}]: {got} vs {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn results_are_bitwise_the_same_in_any_batch() {
        let (rows, cols) = (13, 256);
        let bytes = random_weights(GgmlType::Q4_1, rows, cols, 3);
        let w = QMatrix::new(GgmlType::Q4_1, rows, cols, &bytes).unwrap();
        let x = acts(7, cols);
        let mut batch = Activations::default();
        batch.set(&x, 7, cols);
        let mut all = vec![0.0; 7 * rows];
        gemm(&w, &batch, &mut all);
        for i in 0..7 {
            let mut one = Activations::default();
            one.set(&x[i * cols..(i + 1) * cols], 1, cols);
            let mut out = vec![0.0; rows];
            gemm(&w, &one, &mut out);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&all[i * rows..(i + 1) * rows]), "row {i}");
        }
    }

    /// Float weights (F16, BF16, F32) on every path: against the exact product of their values
    /// (the rounding of f32 sums), and bitwise the same for a row alone, in any batch, and split
    /// over weight rows as threads split it.
    #[test]
    fn float_weights_multiply_exactly_and_batch_invariantly() {
        let paths: Vec<Isa> = [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.available())
            .collect();
        let values = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 2_654_435_761) % 2003) as f32 / 1001.0 - 1.0)
                .collect()
        };
        for (rows, cols) in [(37usize, 768usize), (5, 96)] {
            let v = values(rows * cols);
            for dtype in [GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
                let bytes: Vec<u8> = match dtype {
                    GgmlType::F16 => v
                        .iter()
                        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                        .collect(),
                    GgmlType::BF16 => v
                        .iter()
                        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                        .collect(),
                    _ => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
                };
                let w = QMatrix::new(dtype, rows, cols, &bytes).unwrap();
                let mut wf = vec![0.0f32; rows * cols];
                dequantize(dtype, &bytes, &mut wf).unwrap();
                let x = acts(13, cols);
                for isa in &paths {
                    let mut all = Activations::default();
                    all.set(&x, 13, cols);
                    let got = gemm_with(*isa, &w, &all);
                    for (i, &g) in got.iter().enumerate() {
                        let (m, n) = (i / rows, i % rows);
                        let (wr, xr) =
                            (&wf[n * cols..(n + 1) * cols], &x[m * cols..(m + 1) * cols]);
                        let exact: f64 =
                            wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let scale: f64 =
                            wr.iter().zip(xr).map(|(&a, &b)| (a * b).abs() as f64).sum();
                        assert!(
                            (g as f64 - exact).abs() <= 1e-6 * scale,
                            "{dtype} {isa:?} [{m}, {n}]: {g} vs {exact}"
                        );
                    }
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    for (m, batch) in [(0usize, 1usize), (6, 1), (3, 7), (5, 8)] {
                        let mut some = Activations::default();
                        some.set(&x[m * cols..(m + batch) * cols], batch, cols);
                        let part = gemm_with(*isa, &w, &some);
                        assert_eq!(
                            bits(&part),
                            bits(&got[m * rows..(m + batch) * rows]),
                            "{dtype} {isa:?}: rows {m}..{} alone",
                            m + batch
                        );
                    }
                    // Weight rows 0..16 and 16.. computed apart, as two threads would.
                    if rows > 16 {
                        let mut split = vec![0.0; 13 * rows];
                        let ptr = OutPtr::new(&mut split);
                        driver::gemm(*isa, &w, &all, &ptr, 0..16);
                        driver::gemm(*isa, &w, &all, &ptr, 16..rows);
                        assert_eq!(bits(&split), bits(&got), "{dtype} {isa:?}: split rows");
                    }
                }
            }
        }
    }

    fn gemm_with(isa: Isa, w: &QMatrix<'_>, x: &Activations) -> Vec<f32> {
        let mut out = vec![0.0; x.m * w.rows];
        let ptr = OutPtr::new(&mut out);
        driver::gemm(isa, w, x, &ptr, 0..w.rows);
        out
    }

    #[test]
    fn each_weight_type_reports_the_path_its_products_take() {
        use ProductPath::*;
        for t in [
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q4_K,
        ] {
            assert_eq!(product_path(t, Isa::Avx512), Packed, "{t}");
            assert_eq!(product_path(t, Isa::Portable), Dequantised, "{t}");
        }
        assert_eq!(product_path(GgmlType::Q5_0, Isa::Avx512), Packed);
        assert_eq!(product_path(GgmlType::Q5_1, Isa::Portable), ScalarRowDots);
        assert_eq!(product_path(GgmlType::Q4_1, Isa::Avx512), Packed);
        assert_eq!(product_path(GgmlType::Q8_0, Isa::Portable), ScalarRowDots);
        assert_eq!(product_path(GgmlType::F16, Isa::Portable), Dequantised);
        #[cfg(target_arch = "x86_64")]
        {
            for t in [GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
                assert_eq!(product_path(t, Isa::Avx2), FloatRows, "{t}");
                assert_eq!(product_path(t, Isa::Avx512), FloatRows, "{t}");
            }
            assert_eq!(product_path(GgmlType::Q4_K, Isa::Avx2), Packed);
            assert_eq!(product_path(GgmlType::Q4_0, Isa::Avx2), Packed);
            assert_eq!(product_path(GgmlType::Q8_0, Isa::Avx2), Packed);
            assert_eq!(product_path(GgmlType::Q8_0, Isa::AvxVnni), Packed);
        }
    }

    /// Every packed type in both activation modes, on every packed path this CPU has: the kernel
    /// against the scalar reference of its arithmetic, bitwise, for tiles of 1, 7, 8 and 13 rows
    /// and a partial last panel; and against the exact product of the dequantised weights, within
    /// the activations' rounding.
    #[test]
    fn packed_products_follow_the_reference_arithmetic_bitwise_in_any_batch() {
        let paths: Vec<Isa> = [Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
            .into_iter()
            .filter(|&i| i <= isa() && i.available())
            .collect();
        if paths.is_empty() {
            eprintln!("no AVX2 here: the packed kernels are not used on this CPU");
            return;
        }
        // A partial last panel; 3 super-blocks (24 blocks) a row, or 3 blocks (a part-filled
        // last unit where two blocks share a scale line).
        let shapes: [(usize, usize); 2] = [(37, 768), (21, 96)];
        for ((rows, cols), kind) in shapes
            .into_iter()
            .flat_map(|s| PackedKind::ALL.map(|k| (s, k)))
        {
            let dtype = (0..64)
                .filter_map(GgmlType::from_id)
                .find(|&t| PackedKind::of(t) == Some(kind))
                .unwrap();
            if !cols.is_multiple_of(dtype.block_size()) {
                continue;
            }
            let bytes = random_weights(dtype, rows, cols, 23);
            let raw = QMatrix::new(dtype, rows, cols, &bytes).unwrap();
            let packed = PackedMatrix::pack(&raw).unwrap();
            let w = raw.with_packed(&packed);
            for mode in ActMode::ALL {
                for m in [1, 7, 8, 13] {
                    let x = acts(m, cols);
                    let mut a = Activations {
                        mode,
                        ..Activations::default()
                    };
                    a.set(&x, m, cols);
                    for &path in paths.iter().filter(|&&i| packs(dtype, i)) {
                        let out = gemm_with(path, &w, &a);
                        check_packed(&packed, &raw, &a, &x, &out, &format!("{path:?} {mode}"));
                    }
                }
            }
        }
    }

    /// The largest values times the largest activations of either sign, in every lane and group
    /// at once, are the sums that would overflow a kernel's narrower partial sums: every path
    /// still gives the reference arithmetic.
    #[test]
    fn extreme_values_and_activations_do_not_overflow_the_kernels() {
        let (rows, cols) = (16, 512);
        for kind in PackedKind::ALL {
            let dtype = (0..64)
                .filter_map(GgmlType::from_id)
                .find(|&t| PackedKind::of(t) == Some(kind))
                .unwrap();
            let bytes = random_weights(dtype, rows, cols, 5);
            let raw = QMatrix::new(dtype, rows, cols, &bytes).unwrap();
            let mut packed = PackedMatrix::pack(&raw).unwrap();
            packed.saturate_values();
            let w = raw.with_packed(&packed);
            for (mode, sign) in ActMode::ALL.into_iter().flat_map(|m| [(m, 1.0), (m, -1.0)]) {
                let x = vec![sign; cols];
                let mut a = Activations {
                    mode,
                    ..Activations::default()
                };
                a.set(&x, 1, cols);
                for path in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
                    if path > isa() || !path.available() || !packs(dtype, path) {
                        continue;
                    }
                    let out = gemm_with(path, &w, &a);
                    for (n, got) in out.iter().enumerate() {
                        let want = packed.reference_dot(n, a.row_pairs(0));
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{kind:?} {path:?} {mode} {sign}"
                        );
                    }
                }
            }
        }
    }

    /// `out` (from packed `p`) against `p`'s reference arithmetic and the dequantised weights.
    fn check_packed(
        p: &PackedMatrix,
        raw: &QMatrix<'_>,
        a: &Activations,
        x: &[f32],
        out: &[f32],
        what: &str,
    ) {
        let (rows, cols, dtype) = (raw.rows, raw.cols, raw.dtype);
        let mut wrow = vec![0.0f32; cols];
        for n in 0..rows {
            dequantize(dtype, raw.row(n), &mut wrow).unwrap();
            for i in 0..a.m {
                let want = p.reference_dot(n, a.row_pairs(i));
                let got = out[i * rows + n];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{dtype} {what} m={} [{i},{n}]",
                    a.m
                );
                let row = &x[i * cols..(i + 1) * cols];
                let exact: f64 = wrow.iter().zip(row).map(|(w, x)| f64::from(w * x)).sum();
                let scale: f64 = wrow
                    .iter()
                    .zip(row)
                    .map(|(w, x)| f64::from((w * x).abs()))
                    .sum();
                // 16 bits: half a step in 65,278; 8 bits: in 254 (and the errors partly cancel).
                let tol = if a.mode == ActMode::Int16 { 1e-4 } else { 2e-2 };
                assert!(
                    (f64::from(got) - exact).abs() <= tol * scale.max(1e-6),
                    "{dtype} {what} [{i},{n}] {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        assert!(QMatrix::new(GgmlType::Q4_1, 2, 32, &[0u8; 39]).is_err());
        assert!(QMatrix::new(GgmlType::Q2_K, 1, 256, &[0u8; 83]).is_err());
        assert!(QMatrix::new(GgmlType::Q8_0, 2, 32, &[0u8; 68]).is_ok());
    }
}
