//! RMSNorm of each row, with the residual sum before it, on the thread pool. candle's
//! `rms_norm` runs on rayon's threads while ours wait, and its residual add is another
//! pass: in a 1B model's prefill the two were ~3 % of the time, on one core. The
//! arithmetic is candle's (each row's squares summed in order, then `s / m · alpha`), so
//! the outputs are the same bits.

use super::pool::{self, SendPtr};

/// RMSNorm of each row of `x` (rows of `alpha.len()` values).
pub(crate) fn rms_norm(x: &[f32], alpha: &[f32], eps: f32) -> Vec<f32> {
    rows(x, None, alpha, eps).1
}

/// `x + delta` and the RMSNorm of each of its rows (rows of `alpha.len()` values).
pub(crate) fn add_rms_norm(x: &[f32], delta: &[f32], alpha: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let (sum, normed) = rows(x, Some(delta), alpha, eps);
    (sum.expect("a sum when there is a delta"), normed)
}

/// The sum (when there is a `delta`) and the normed rows, one work unit per row.
fn rows(x: &[f32], delta: Option<&[f32]>, alpha: &[f32], eps: f32) -> (Option<Vec<f32>>, Vec<f32>) {
    let d = alpha.len();
    assert!(d > 0 && x.len().is_multiple_of(d), "whole rows of {d} values");
    if let Some(delta) = delta {
        assert_eq!(delta.len(), x.len(), "a delta per value");
    }
    let mut sum: Option<Vec<f32>> = delta.map(|_| Vec::with_capacity(x.len()));
    let mut normed: Vec<f32> = Vec::with_capacity(x.len());
    let sum_at = SendPtr(sum.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()));
    let normed_at = SendPtr(normed.as_mut_ptr());
    pool::for_each_chunk(x.len() / d, 4 * x.len(), |rows| {
        for r in rows {
            let values = r * d..(r + 1) * d;
            // SAFETY: both buffers have room for x.len() values, and each row writes only its
            // own, each value before it is read back
            unsafe {
                let src: &[f32] = match delta {
                    Some(delta) => {
                        let s = sum_at.get().add(values.start);
                        for (j, (a, b)) in x[values.clone()].iter().zip(&delta[values.clone()]).enumerate() {
                            *s.add(j) = a + b;
                        }
                        std::slice::from_raw_parts(s, d)
                    }
                    None => &x[values.clone()],
                };
                let out = std::slice::from_raw_parts_mut(normed_at.get().add(values.start), d);
                norm_row(src, alpha, eps, out);
            }
        }
    });
    // SAFETY: the job has ended, and its rows covered all x.len() values of both buffers
    unsafe {
        if let Some(s) = sum.as_mut() {
            s.set_len(x.len());
        }
        normed.set_len(x.len());
    }
    (sum, normed)
}

/// One row, as candle's `rms_norm` computes it.
fn norm_row(src: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    let sum2 = src.iter().map(|&v| v * v).sum::<f32>();
    let m = (sum2 / src.len() as f32 + eps).sqrt();
    for ((o, &s), &a) in out.iter_mut().zip(src).zip(alpha) {
        *o = s / m * a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// The same bits as candle's `rms_norm` and `+`, over rows enough to run in parallel.
    #[test]
    fn matches_candle_bit_for_bit() {
        let (n, d) = (67, 96);
        let x: Vec<f32> = (0..n * d).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0).collect();
        let delta: Vec<f32> = (0..n * d).map(|i| ((i * 104_729 % 777) as f32 - 388.0) / 91.0).collect();
        let alpha: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 / 64.0).collect();
        let eps = 1e-5;
        let t = |v: &[f32], shape: &[usize]| Tensor::from_slice(v, shape, &Device::Cpu).unwrap();
        let (xt, dt, at) = (t(&x, &[n, d]), t(&delta, &[n, d]), t(&alpha, &[d]));
        let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();

        let expected = flat(candle_nn::ops::rms_norm(&xt, &at, eps).unwrap());
        assert_eq!(bits(&rms_norm(&x, &alpha, eps)), bits(&expected));

        let sum_t = (&xt + &dt).unwrap();
        let expected_norm = flat(candle_nn::ops::rms_norm(&sum_t, &at, eps).unwrap());
        let (sum, normed) = add_rms_norm(&x, &delta, &alpha, eps);
        assert_eq!(bits(&sum), bits(&flat(sum_t)));
        assert_eq!(bits(&normed), bits(&expected_norm));
    }
}
