//! Products with float weights (F16, BF16, F32), read in the GGUF's own row-major layout (no
//! repacked copy: memory stays the file's) against the activations' f32 rows, with f32
//! multiply-adds: what a model saved unquantised runs on, at the memory's rate in decode.
//!
//! An output element (weight row `n`, activation row `m`) is one vector of partial sums over the
//! columns in order (lane `l` holds columns `l, l + LANES, …`), reduced across lanes in a fixed
//! order at the end. Tiles of up to 4 weight rows × 4 activation rows (2 on AVX2, whose 16
//! registers hold fewer accumulators), or 8 weight rows × 1, share their loads; a tile's shape
//! changes no element's arithmetic, so the product is batch-invariant on each path.

use super::{Activations, OutPtr, QMatrix};
use crate::quant::GgmlType;
use crate::simd::{Avx2, Avx512, WideLoads};
use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
use std::ops::Range;

/// Weight rows of a tile with several activation rows, and with one (decode: more rows streamed
/// at once keep more of the memory's lines in flight).
const W_ROWS: usize = 4;
const W_ROWS_ONE: usize = 8;
/// Weight rows that one pass over the activation tiles covers (their bytes stay in L1/L2 while
/// every tile of activation rows passes them).
const RUN_ROWS: usize = 16;

/// Whether `dtype` is a float type this module multiplies.
pub(super) fn multiplies(dtype: GgmlType) -> bool {
    matches!(dtype, GgmlType::F16 | GgmlType::BF16 | GgmlType::F32)
}

/// Rows `rows` of `out = x · wᵀ` with AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL, F16C and FMA; `w`'s type is one [`multiplies`] takes;
/// `x` holds its f32 rows; `out` is `x.m × w.rows` and no other thread writes `rows`' columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(super) unsafe fn gemm_avx512(
    w: &QMatrix<'_>,
    x: &Activations,
    out: &OutPtr,
    rows: Range<usize>,
) {
    // SAFETY: the caller's contract.
    let s = unsafe { Avx512::new() };
    by_type(s, w, x, out, rows);
}

/// Rows `rows` of `out = x · wᵀ` with AVX2.
///
/// # Safety
/// As [`gemm_avx512`], with AVX2, F16C and FMA.
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) unsafe fn gemm_avx2(w: &QMatrix<'_>, x: &Activations, out: &OutPtr, rows: Range<usize>) {
    // SAFETY: the caller's contract.
    let s = unsafe { Avx2::new() };
    by_type(s, w, x, out, rows);
}

/// How a weight type's values become f32 lanes.
trait Widen {
    const BYTES: usize;
    /// `LANES` values from `p`.
    ///
    /// # Safety
    /// `p ..+ LANES × BYTES` is readable.
    unsafe fn load<S: WideLoads>(s: S, p: *const u8) -> S::V;
}

struct F16;
struct Bf16;
struct F32;

impl Widen for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load<S: WideLoads>(s: S, p: *const u8) -> S::V {
        // SAFETY: the caller's contract.
        unsafe { s.load_all_f16(p.cast()) }
    }
}

impl Widen for Bf16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load<S: WideLoads>(s: S, p: *const u8) -> S::V {
        // SAFETY: the caller's contract.
        unsafe { s.load_all_bf16(p.cast()) }
    }
}

impl Widen for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load<S: WideLoads>(s: S, p: *const u8) -> S::V {
        // SAFETY: the caller's contract.
        unsafe { s.load_all(p.cast()) }
    }
}

#[inline(always)]
fn by_type<S: WideLoads>(s: S, w: &QMatrix<'_>, x: &Activations, out: &OutPtr, rows: Range<usize>) {
    match w.dtype {
        GgmlType::F16 => runs::<S, F16>(s, w, x, out, rows),
        GgmlType::BF16 => runs::<S, Bf16>(s, w, x, out, rows),
        GgmlType::F32 => runs::<S, F32>(s, w, x, out, rows),
        other => unreachable!("{other} is not a float type"),
    }
}

/// Runs of [`RUN_ROWS`] weight rows; in each, every tile of activation rows in turn.
#[inline(always)]
fn runs<S: WideLoads, E: Widen>(
    s: S,
    w: &QMatrix<'_>,
    x: &Activations,
    out: &OutPtr,
    rows: Range<usize>,
) {
    assert_eq!(x.k, w.cols);
    assert!(w.cols.is_multiple_of(S::LANES) && w.row(0).len() == w.cols * E::BYTES);
    // Accumulators: W_ROWS × act rows, plus the act rows' and one weight register.
    let max_acts = if S::REGISTERS >= 32 { 4 } else { 2 };
    for run in rows.clone().step_by(RUN_ROWS) {
        let run = run..(run + RUN_ROWS).min(rows.end);
        for m in (0..x.m).step_by(max_acts) {
            let acts = (x.m - m).min(max_acts);
            let step = if acts == 1 { W_ROWS_ONE } else { W_ROWS };
            for n in run.clone().step_by(step) {
                let ws = (run.end - n).min(step);
                match (ws, acts) {
                    (W_ROWS_ONE, 1) => tile::<S, E, W_ROWS_ONE, 1>(s, w, x, out, n, m),
                    (W_ROWS, 4) => tile::<S, E, W_ROWS, 4>(s, w, x, out, n, m),
                    (W_ROWS, 3) => tile::<S, E, W_ROWS, 3>(s, w, x, out, n, m),
                    (W_ROWS, 2) => tile::<S, E, W_ROWS, 2>(s, w, x, out, n, m),
                    (_, 4) => rows_one_by_one::<S, E, 4>(s, w, x, out, n..n + ws, m),
                    (_, 3) => rows_one_by_one::<S, E, 3>(s, w, x, out, n..n + ws, m),
                    (_, 2) => rows_one_by_one::<S, E, 2>(s, w, x, out, n..n + ws, m),
                    _ => rows_one_by_one::<S, E, 1>(s, w, x, out, n..n + ws, m),
                }
            }
        }
    }
}

#[inline(always)]
fn rows_one_by_one<S: WideLoads, E: Widen, const A: usize>(
    s: S,
    w: &QMatrix<'_>,
    x: &Activations,
    out: &OutPtr,
    rows: Range<usize>,
    m: usize,
) {
    for n in rows {
        tile::<S, E, 1, A>(s, w, x, out, n, m);
    }
}

/// Weight rows `n..n + R` × activation rows `m..m + A`.
#[inline(always)]
fn tile<S: WideLoads, E: Widen, const R: usize, const A: usize>(
    s: S,
    w: &QMatrix<'_>,
    x: &Activations,
    out: &OutPtr,
    n: usize,
    m: usize,
) {
    let k = w.cols;
    let wrows: [&[u8]; R] = std::array::from_fn(|i| w.row(n + i));
    let arows: [&[f32]; A] = std::array::from_fn(|j| x.row_f32(m + j));
    let mut acc = [[s.zero(); A]; R];
    // The same bytes R rows on: the next tile's (rows are consecutive in the file), asked
    // for into L2 while this one multiplies. The hardware prefetcher alone leaves decode at
    // about half the memory's rate; asked for into L1, they would evict the lines in use.
    let ahead = R * k * E::BYTES;
    for c in (0..k).step_by(S::LANES) {
        // SAFETY: `c + LANES ≤ k` (k is a multiple of LANES, asserted by `runs`), inside every
        // activation row (`k` floats) and weight row (`k × BYTES` bytes, asserted); a prefetch
        // never faults, wherever it points.
        unsafe {
            let xs: [S::V; A] = std::array::from_fn(|j| s.load_all(arows[j].as_ptr().add(c)));
            for (acc, wrow) in acc.iter_mut().zip(&wrows) {
                let at = wrow.as_ptr().wrapping_add(c * E::BYTES);
                _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(ahead).cast());
                let wv = E::load(s, at);
                for (a, &xv) in acc.iter_mut().zip(&xs) {
                    *a = s.fmadd(wv, xv, *a);
                }
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (j, &a) in acc.iter().enumerate() {
            // SAFETY: column `n + i` belongs to this call's rows (the caller's contract).
            unsafe { out.write((m + j) * w.rows + n + i, s.reduce_add(a)) };
        }
    }
}
