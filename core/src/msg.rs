//! The message vocabulary of every protocol: [`ToServer`], [`ToWorker`], and the tensor
//! payload [`Values`].
//!
//! Messages borrow their payload, so a message decoded from a network buffer points into
//! that buffer ([`Values::LittleEndian`]) and one built in-process points at a model or
//! gradient slice ([`Values::Slice`]); either is read straight into the destination without
//! an intermediate copy. The sender of a `ToServer` message is not in the message: the
//! transport knows which (authenticated) worker a message came from and passes it to
//! `handle` separately.
//!
//! | message | used by |
//! |---|---|
//! | [`ToServer::Join`] | every protocol: a worker (re)joins and asks for the model |
//! | [`ToServer::Grad`] | BSP, ASP, backup workers, DBW, BAP, grouped |
//! | [`ToServer::Delta`] | WBSP |
//! | [`ToServer::Pull`] | BAP, SSP, WBSP |
//! | [`ToServer::Clock`] | SSP |
//! | [`ToServer::Leave`] | every protocol: a clean goodbye |
//! | [`ToWorker::Model`] | every protocol |
//! | [`ToWorker::NotNewer`] | BAP, SSP |
//! | [`ToWorker::PushAck`] | WBSP |
//! | [`ToWorker::Abort`] | backup workers, DBW, BAP |
//! | [`ToWorker::Stop`] | every protocol: training is over |

use crate::id::Version;
use crate::math::{self, LengthMismatch, Scalar};

/// A tensor payload: a borrowed slice of elements, or their little-endian bytes as they
/// came off the wire.
#[derive(Clone, Copy, Debug)]
pub enum Values<'a, T> {
    /// Elements in host representation (in-process transports).
    Slice(&'a [T]),
    /// Raw little-endian bytes; the length is a multiple of `T::BYTES` when built by
    /// [`crate::wire`] (other lengths are refused by every reader here).
    LittleEndian(&'a [u8]),
}

impl<T: Scalar> Values<'_, T> {
    /// Number of elements (for [`Values::LittleEndian`], whole elements only).
    pub fn len(&self) -> usize {
        match self {
            Values::Slice(s) => s.len(),
            Values::LittleEndian(b) => b.len() / T::BYTES,
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that the payload has exactly `dim` elements (and, for bytes, no partial one).
    pub fn check_len(&self, dim: usize) -> Result<(), LengthMismatch> {
        let ok = match self {
            Values::Slice(s) => s.len() == dim,
            Values::LittleEndian(b) => b.len() % T::BYTES == 0 && b.len() / T::BYTES == dim,
        };
        if ok { Ok(()) } else { Err(LengthMismatch { expected: dim, actual: self.len() }) }
    }

    /// Element `i`, if in range.
    pub fn get(&self, i: usize) -> Option<T> {
        match self {
            Values::Slice(s) => s.get(i).copied(),
            Values::LittleEndian(b) => {
                let start = i.checked_mul(T::BYTES)?;
                b.get(start..start.checked_add(T::BYTES)?).and_then(T::from_le)
            }
        }
    }

    /// `Σ x_i²` over the payload: the same lanes and order as [`math::squared_norm`], so a
    /// payload gives the same bits whether it arrives as a slice or as bytes.
    pub fn squared_norm(&self) -> T {
        match self {
            Values::Slice(s) => math::squared_norm(s),
            Values::LittleEndian(b) => {
                let mut lanes = [T::zero(); LANES];
                let mut chunks = b.chunks_exact(LANES * T::BYTES);
                for c in &mut chunks {
                    let v = decode_chunk::<T>(c);
                    for (l, v) in lanes.iter_mut().zip(&v) {
                        *l = *l + *v * *v;
                    }
                }
                let tail = chunks.remainder().chunks_exact(T::BYTES).fold(T::zero(), |a, e| {
                    let v = T::from_le(e).unwrap_or_else(T::zero);
                    a + v * v
                });
                math::sum_lanes(&{ lanes }) + tail
            }
        }
    }

    /// Whether every element is finite (the verdict of `is_finite` on each; vectorised as
    /// [`math::all_finite`], for bytes too).
    pub fn all_finite(&self) -> bool {
        match self {
            Values::Slice(s) => math::all_finite(s),
            Values::LittleEndian(b) => {
                let mut blocks = b.chunks_exact(math::FINITE_BLOCK * T::BYTES);
                for block in &mut blocks {
                    if !le_finite_lanes::<T>(block) {
                        return false;
                    }
                }
                le_finite_lanes::<T>(blocks.remainder())
            }
        }
    }

    /// `dst = values`.
    pub fn copy_into(&self, dst: &mut [T]) -> Result<(), LengthMismatch> {
        self.check_len(dst.len())?;
        match self {
            Values::Slice(s) => dst.copy_from_slice(s),
            Values::LittleEndian(b) => zip_le(dst, b, |d, v| *d = v),
        }
        Ok(())
    }

    /// `dst += a * values`.
    pub fn scaled_add_into(&self, dst: &mut [T], a: T) -> Result<(), LengthMismatch> {
        self.check_len(dst.len())?;
        match self {
            Values::Slice(s) => math::scaled_add(dst, a, s)?,
            Values::LittleEndian(b) => zip_le(dst, b, |d, v| *d = *d + a * v),
        }
        Ok(())
    }

    /// `dst += values` (exact for integer-valued test data; a separate loop from
    /// [`Self::scaled_add_into`] so the common unscaled case does one multiply fewer).
    pub fn add_into(&self, dst: &mut [T]) -> Result<(), LengthMismatch> {
        self.check_len(dst.len())?;
        match self {
            Values::Slice(s) => math::add(dst, s)?,
            Values::LittleEndian(b) => zip_le(dst, b, |d, v| *d = *d + v),
        }
        Ok(())
    }

    /// A round's last gradient folded into the update step: `params += a * (acc + factor ·
    /// values); acc = 0`, one pass over the three. Every element has the bits of
    /// [`Self::add_into`] (`factor == 1`) or [`Self::scaled_add_into`] (otherwise) into `acc`
    /// followed by [`math::apply_and_clear`]`(params, a, acc)`. On a length mismatch
    /// nothing is written.
    pub fn add_apply_and_clear(&self, factor: T, params: &mut [T], a: T, acc: &mut [T]) -> Result<(), LengthMismatch> {
        self.check_len(params.len())?;
        if acc.len() != params.len() {
            return Err(LengthMismatch { expected: params.len(), actual: acc.len() });
        }
        match (self, factor == T::one()) {
            (Values::Slice(s), true) => math::add_apply_and_clear(params, a, acc, s),
            (Values::Slice(s), false) => math::scaled_add_apply_and_clear(params, a, acc, factor, s),
            (Values::LittleEndian(b), true) => {
                fold_apply_le(params, a, acc, b, |g, v| g + v);
                Ok(())
            }
            (Values::LittleEndian(b), false) => {
                fold_apply_le(params, a, acc, b, |g, v| g + factor * v);
                Ok(())
            }
        }
    }

    /// `out = acc + values`, returning `Σ values²` with the bits of [`Self::squared_norm`]:
    /// the admission measure and the accumulation in one pass over the payload (see
    /// [`math::add_to_measured`]). `acc` is never written; every `out_i` has the bits
    /// [`Self::add_into`] would give `acc_i`.
    pub fn add_to_measured(&self, acc: &[T], out: &mut [T]) -> Result<T, LengthMismatch> {
        self.check_len(out.len())?;
        match self {
            Values::Slice(s) => math::add_to_measured(out, acc, s),
            Values::LittleEndian(b) => {
                if acc.len() != out.len() {
                    return Err(LengthMismatch { expected: out.len(), actual: acc.len() });
                }
                let mut lanes = [T::zero(); LANES];
                let mut oc = out.chunks_exact_mut(LANES);
                let mut ac = acc.chunks_exact(LANES);
                let mut bc = b.chunks_exact(LANES * T::BYTES);
                for ((os, as_), bs) in (&mut oc).zip(&mut ac).zip(&mut bc) {
                    let (Ok(os), Ok(as_)) = (<&mut [T; LANES]>::try_from(os), <&[T; LANES]>::try_from(as_)) else {
                        continue;
                    };
                    let v = decode_chunk::<T>(bs);
                    for (((o, a), v), l) in os.iter_mut().zip(as_).zip(&v).zip(lanes.iter_mut()) {
                        *o = *a + *v;
                        *l = *l + *v * *v;
                    }
                }
                let mut tail = T::zero();
                let rest = oc.into_remainder().iter_mut().zip(ac.remainder());
                for ((o, a), e) in rest.zip(bc.remainder().chunks_exact(T::BYTES)) {
                    let v = T::from_le(e).unwrap_or_else(T::zero);
                    *o = *a + v;
                    tail = tail + v * v;
                }
                Ok(math::sum_lanes(&{ lanes }) + tail)
            }
        }
    }

    /// `out = acc + a * values`; every `out_i` has the bits [`Self::scaled_add_into`] would
    /// give `acc_i`.
    pub fn scaled_add_to(&self, acc: &[T], a: T, out: &mut [T]) -> Result<(), LengthMismatch> {
        self.check_len(out.len())?;
        match self {
            Values::Slice(s) => math::scaled_add_to(out, acc, a, s),
            Values::LittleEndian(b) => {
                if acc.len() != out.len() {
                    return Err(LengthMismatch { expected: out.len(), actual: acc.len() });
                }
                let mut oc = out.chunks_exact_mut(LANES);
                let mut ac = acc.chunks_exact(LANES);
                let mut bc = b.chunks_exact(LANES * T::BYTES);
                for ((os, as_), bs) in (&mut oc).zip(&mut ac).zip(&mut bc) {
                    let v = decode_chunk::<T>(bs);
                    for ((o, g), v) in os.iter_mut().zip(as_).zip(v) {
                        *o = *g + a * v;
                    }
                }
                let rest = oc.into_remainder().iter_mut().zip(ac.remainder());
                for ((o, g), e) in rest.zip(bc.remainder().chunks_exact(T::BYTES)) {
                    *o = *g + a * T::from_le(e).unwrap_or_else(T::zero);
                }
                Ok(())
            }
        }
    }
}

/// Elements per step of the little-endian loops (as the slice kernels).
const LANES: usize = math::LANES;

/// Decodes up to [`LANES`] elements into a fixed-size array (zeros past the end of `bytes`;
/// callers pass exactly `LANES * T::BYTES` bytes). A constant trip count, so it vectorises
/// (a plain load on little-endian hosts) and the array stays in registers.
#[inline(always)]
fn decode_chunk<T: Scalar>(bytes: &[u8]) -> [T; LANES] {
    let mut v = [T::zero(); LANES];
    for (x, e) in v.iter_mut().zip(bytes.chunks_exact(T::BYTES)) {
        *x = T::from_le(e).unwrap_or_else(T::zero);
    }
    v
}

/// Whether every element of `bytes` (whole elements only) is finite: lanes of `v - v` as in
/// [`math::all_finite`].
#[inline(always)]
fn le_finite_lanes<T: Scalar>(bytes: &[u8]) -> bool {
    let mut lanes = [T::zero(); LANES];
    let mut chunks = bytes.chunks_exact(LANES * T::BYTES);
    for c in &mut chunks {
        let v = decode_chunk::<T>(c);
        for (l, v) in lanes.iter_mut().zip(&v) {
            *l = *l + math::zero_if_finite(*v);
        }
    }
    let tail = chunks.remainder().chunks_exact(T::BYTES).fold(T::zero(), |a, e| {
        let v = T::from_le(e).unwrap_or_else(T::zero);
        a + math::zero_if_finite(v)
    });
    math::lanes_are_zero(&lanes) & (tail == T::zero())
}

/// `t = add(acc_i, decode(bytes_i)); params_i += a * t; acc_i = 0` in chunks of [`LANES`]
/// elements (the little-endian form of [`math::add_apply_and_clear`]). The caller checked
/// the lengths.
#[inline(always)]
fn fold_apply_le<T: Scalar>(params: &mut [T], a: T, acc: &mut [T], bytes: &[u8], add: impl Fn(T, T) -> T) {
    let mut pc = params.chunks_exact_mut(LANES);
    let mut gc = acc.chunks_exact_mut(LANES);
    let mut bc = bytes.chunks_exact(LANES * T::BYTES);
    for ((ps, gs), bs) in (&mut pc).zip(&mut gc).zip(&mut bc) {
        let (Ok(ps), Ok(gs)) = (<&mut [T; LANES]>::try_from(ps), <&mut [T; LANES]>::try_from(gs)) else { continue };
        let v = decode_chunk::<T>(bs);
        for ((p, g), v) in ps.iter_mut().zip(gs.iter()).zip(v) {
            *p = *p + a * add(*g, v);
        }
        *gs = [T::zero(); LANES];
    }
    let rest = pc.into_remainder().iter_mut().zip(gc.into_remainder());
    for ((p, g), e) in rest.zip(bc.remainder().chunks_exact(T::BYTES)) {
        *p = *p + a * add(*g, T::from_le(e).unwrap_or_else(T::zero));
        *g = T::zero();
    }
}

/// Calls `f(dst_i, decode(bytes_i))` for every element, in chunks of [`LANES`] elements
/// whose inner loop has a constant trip count, so the decode and `f` vectorise together
/// (on little-endian hosts the decode is a plain load). The caller checked the lengths.
#[inline(always)]
fn zip_le<T: Scalar>(dst: &mut [T], bytes: &[u8], mut f: impl FnMut(&mut T, T)) {
    let mut dst_chunks = dst.chunks_exact_mut(LANES);
    let mut byte_chunks = bytes.chunks_exact(LANES * T::BYTES);
    for (ds, bs) in (&mut dst_chunks).zip(&mut byte_chunks) {
        let Ok(ds) = <&mut [T; LANES]>::try_from(ds) else { continue };
        let v = decode_chunk::<T>(bs);
        for (d, v) in ds.iter_mut().zip(v) {
            f(d, v);
        }
    }
    for (d, e) in dst_chunks.into_remainder().iter_mut().zip(byte_chunks.remainder().chunks_exact(T::BYTES)) {
        f(d, T::from_le(e).unwrap_or_else(T::zero));
    }
}

/// A message from a worker (or a group server acting as one) to its server.
#[derive(Clone, Copy, Debug)]
pub enum ToServer<'a, T> {
    /// The worker starts or restarts. `epoch` grows with every restart of the same worker id,
    /// so the server can tell a rejoin from a replay. The server answers with the model.
    Join {
        /// The worker's session epoch.
        epoch: u32,
    },
    /// A gradient computed on model `base`.
    Grad {
        /// The model version the gradient was computed on.
        base: Version,
        /// The worker's own iteration index (BAP's iteration `j`; others send their step count).
        iteration: u64,
        /// Per-worker sequence number, strictly increasing within an epoch (deduplication).
        seq: u64,
        /// The gradient.
        values: Values<'a, T>,
        /// The worker's loss on the minibatch the gradient was computed on, if it reports
        /// one (finite; a server refuses a non-finite one with
        /// [`Reject::LossNotFinite`](crate::Reject::LossNotFinite)).
        loss: Option<f32>,
    },
    /// WBSP: the change of the worker's local model since its previous upload.
    Delta {
        /// The round (model version) the worker's local model started from.
        round: Version,
        /// Local SGD steps contained in this delta (more than one when coalesced).
        local_steps: u32,
        /// Per-worker sequence number (deduplication).
        seq: u64,
        /// The delta (already includes the learning rate: `w_local - w_last_upload`).
        values: Values<'a, T>,
        /// The mean of the worker's minibatch losses over the local steps in this delta, if
        /// it reports them (finite).
        loss: Option<f32>,
    },
    /// Asks for the model if the server has one newer than `have`.
    Pull {
        /// The version the worker already has.
        have: Version,
        /// SSP: the oldest server clock the worker can accept (its clock minus the bound);
        /// the server answers once its clock reaches it. Other protocols send 0.
        min_clock: u64,
    },
    /// SSP: the worker finished clock `clock`; `values` is that clock's additive update.
    Clock {
        /// The clock that ended.
        clock: u64,
        /// Per-worker sequence number (deduplication).
        seq: u64,
        /// The update `u` (the server does `w += u`).
        values: Values<'a, T>,
        /// The mean of the worker's minibatch losses over the clock's steps, if it reports
        /// them (finite).
        loss: Option<f32>,
    },
    /// The worker leaves cleanly; the server treats it as lost.
    Leave,
}

/// A message from a server to a worker (or from the central server to a group server).
#[derive(Clone, Copy, Debug)]
pub enum ToWorker<'a, T> {
    /// The model at `version`.
    Model {
        /// The model version.
        version: Version,
        /// SSP: the server clock of this snapshot (every update with a timestamp below it is
        /// included). Other protocols send the version's number.
        clock: u64,
        /// The parameters.
        values: Values<'a, T>,
    },
    /// Answer to a pull: the worker's copy is current.
    NotNewer {
        /// The server's version.
        version: Version,
    },
    /// WBSP: reply to an upload; `pull_now` tells the worker the round closed and it must
    /// load the new model.
    PushAck {
        /// The server's current round.
        round: Version,
        /// Whether to pull the new model now.
        pull_now: bool,
    },
    /// Stop the computation for `iteration` (a version, or BAP's iteration index); its result
    /// would be dropped.
    Abort {
        /// The abandoned iteration.
        iteration: u64,
    },
    /// Training is over; the worker stops.
    Stop,
}

impl<T> ToServer<'_, T> {
    /// The minibatch loss a contribution reports (`Grad`, `Delta`, `Clock`), if any.
    pub fn loss(&self) -> Option<f32> {
        match self {
            ToServer::Grad { loss, .. } | ToServer::Delta { loss, .. } | ToServer::Clock { loss, .. } => *loss,
            _ => None,
        }
    }

    /// A short name of the message kind, for logs and errors.
    pub fn kind_name(&self) -> &'static str {
        match self {
            ToServer::Join { .. } => "Join",
            ToServer::Grad { .. } => "Grad",
            ToServer::Delta { .. } => "Delta",
            ToServer::Pull { .. } => "Pull",
            ToServer::Clock { .. } => "Clock",
            ToServer::Leave => "Leave",
        }
    }
}

impl<T> ToWorker<'_, T> {
    /// A short name of the message kind, for logs and errors.
    pub fn kind_name(&self) -> &'static str {
        match self {
            ToWorker::Model { .. } => "Model",
            ToWorker::NotNewer { .. } => "NotNewer",
            ToWorker::PushAck { .. } => "PushAck",
            ToWorker::Abort { .. } => "Abort",
            ToWorker::Stop => "Stop",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn little_endian_values_read_like_slices() {
        let xs = [1.5f32, -2.0, 3.25];
        let mut bytes = [0u8; 12];
        for (x, out) in xs.iter().zip(bytes.chunks_exact_mut(4)) {
            assert!(x.write_le(out));
        }
        let le: Values<'_, f32> = Values::LittleEndian(&bytes);
        let sl = Values::Slice(&xs);
        assert_eq!(le.len(), 3);
        assert_eq!(le.get(1), Some(-2.0));
        assert_eq!(le.get(3), None);
        assert_eq!(le.get(usize::MAX), None);
        assert_eq!(le.squared_norm(), sl.squared_norm());
        let (mut a, mut b) = ([1.0f32; 3], [1.0f32; 3]);
        le.scaled_add_into(&mut a, 2.0).unwrap();
        sl.scaled_add_into(&mut b, 2.0).unwrap();
        assert_eq!(a, b);
        assert!(le.check_len(3).is_ok());
        let partial: Values<'_, f32> = Values::LittleEndian(&bytes[..11]);
        assert!(partial.check_len(2).is_err());
        assert!(partial.copy_into(&mut [0.0; 2]).is_err());
    }

    fn le_bytes(xs: &[f32]) -> std::vec::Vec<u8> {
        xs.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn folded_close_refuses_mismatched_lengths_and_writes_nothing() {
        let bytes = le_bytes(&[1.0, 2.0]);
        let (mut p, mut g) = ([5.0f32; 2], [7.0f32; 3]);
        for v in [Values::LittleEndian(&bytes), Values::Slice(&[1.0f32, 2.0][..])] {
            assert!(v.add_apply_and_clear(1.0, &mut p, 1.0, &mut g).is_err());
            assert!(v.add_apply_and_clear(2.0, &mut p, 1.0, &mut g[..2]).is_ok() && p == [14.0, 16.0]);
            assert!(v.add_apply_and_clear(1.0, &mut [0.0; 3], 1.0, &mut g).is_err());
            p = [5.0; 2];
            g = [7.0; 3];
        }
        let odd = [0u8; 7];
        assert!(Values::<f32>::LittleEndian(&odd).add_apply_and_clear(1.0, &mut p, 1.0, &mut g[..2]).is_err());
        assert_eq!((p, g), ([5.0; 2], [7.0; 3]));
    }

    proptest::proptest! {
        // The vectorised byte check gives the verdict of `is_finite` on every element, for
        // any bit pattern (NaN payloads, ±∞, subnormals, -0) at any position around the
        // chunk and block boundaries, f32 and f64, and ignores a partial trailing element.
        #[test]
        fn little_endian_finite_check_matches_the_scalar_definition(
            len in 0usize..2200,
            bad in proptest::option::of((0usize..2200, proptest::num::u64::ANY)),
            trailing in 0usize..4,
        ) {
            let mut xs: std::vec::Vec<f64> =
                (0..len).map(|i| if i % 3 == 0 { f64::from_bits(i as u64) } else { -(i as f64) }).collect();
            if let Some((at, bits)) = bad {
                if let Some(v) = xs.get_mut(at) {
                    *v = f64::from_bits(bits | 0x7ff0_0000_0000_0000);
                }
            }
            let f32s: std::vec::Vec<f32> = xs.iter().map(|v| {
                if v.is_finite() { f32::from_bits(v.to_bits() as u32 & 0x807f_ffff) } else { f32::from_bits(0x7f80_0000 | v.to_bits() as u32) }
            }).collect();
            let mut b64: std::vec::Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut b32 = le_bytes(&f32s);
            b64.extend(core::iter::repeat_n(0xff, trailing));
            b32.extend(core::iter::repeat_n(0xff, trailing));
            proptest::prop_assert_eq!(Values::<f64>::LittleEndian(&b64).all_finite(), xs.iter().all(|v| v.is_finite()));
            proptest::prop_assert_eq!(Values::<f32>::LittleEndian(&b32).all_finite(), f32s.iter().all(|v| v.is_finite()));
            proptest::prop_assert_eq!(Values::Slice(&f32s[..]).all_finite(), f32s.iter().all(|v| v.is_finite()));
        }

        // The chunked little-endian loops (16 lanes plus a tail) agree bit for bit with the
        // slice kernels at every length around the chunk boundaries.
        #[test]
        fn little_endian_kernels_match_slice_kernels_bitwise(
            xs in proptest::collection::vec(-1e3f32..1e3, 0..70),
            a in -4.0f32..4.0,
        ) {
            let bytes = le_bytes(&xs);
            let (le, sl) = (Values::<f32>::LittleEndian(&bytes), Values::Slice(&xs[..]));
            proptest::prop_assert_eq!(le.squared_norm().to_bits(), sl.squared_norm().to_bits());
            let start: std::vec::Vec<f32> = (0..xs.len()).map(|i| i as f32 * 0.37 - 3.0).collect();
            let (mut x, mut y) = (start.clone(), start.clone());
            le.add_into(&mut x).unwrap();
            sl.add_into(&mut y).unwrap();
            proptest::prop_assert_eq!(&x, &y);
            le.scaled_add_into(&mut x, a).unwrap();
            sl.scaled_add_into(&mut y, a).unwrap();
            proptest::prop_assert_eq!(&x, &y);
            // The fused add-and-measure and its scaled form, bytes and slices alike.
            let (mut o1, mut o2) = (std::vec![0.0f32; xs.len()], std::vec![0.0f32; xs.len()]);
            let sq1 = le.add_to_measured(&y, &mut o1).unwrap();
            let sq2 = sl.add_to_measured(&y, &mut o2).unwrap();
            proptest::prop_assert_eq!(sq1.to_bits(), sl.squared_norm().to_bits());
            proptest::prop_assert_eq!(sq2.to_bits(), sl.squared_norm().to_bits());
            let mut z = y.clone();
            sl.add_into(&mut z).unwrap();
            proptest::prop_assert_eq!(&o1, &z);
            proptest::prop_assert_eq!(&o2, &z);
            le.scaled_add_to(&y, a, &mut o1).unwrap();
            sl.scaled_add_to(&y, a, &mut o2).unwrap();
            let mut z = y.clone();
            sl.scaled_add_into(&mut z, a).unwrap();
            proptest::prop_assert_eq!(&o1, &z);
            proptest::prop_assert_eq!(&o2, &z);
            proptest::prop_assert!(le.add_to_measured(&y[..y.len().saturating_sub(1)], &mut o1).is_err() || y.is_empty());
            // The folded close, bytes and slices alike, scaled or not, against add then apply.
            for f in [1.0f32, a] {
                let params: std::vec::Vec<f32> = (0..xs.len()).map(|i| 1.0 - i as f32 * 0.11).collect();
                let (mut p0, mut g0) = (params.clone(), y.clone());
                if f == 1.0 { sl.add_into(&mut g0).unwrap() } else { sl.scaled_add_into(&mut g0, f).unwrap() }
                math::apply_and_clear(&mut p0, 0.25 - a, &mut g0).unwrap();
                for v in [le, sl] {
                    let (mut p, mut g) = (params.clone(), y.clone());
                    v.add_apply_and_clear(f, &mut p, 0.25 - a, &mut g).unwrap();
                    proptest::prop_assert!(p.iter().zip(&p0).all(|(u, w)| u.to_bits() == w.to_bits()));
                    proptest::prop_assert!(g.iter().all(|v| v.to_bits() == 0));
                }
            }
            le.copy_into(&mut x).unwrap();
            proptest::prop_assert_eq!(&x, &xs);
            let naive: f64 = xs.iter().map(|v| f64::from(*v) * f64::from(*v)).sum();
            let got = f64::from(le.squared_norm());
            proptest::prop_assert!((got - naive).abs() <= 1e-5 * naive.max(1.0));
        }
    }
}
