//! Reductions: the `ncclRedOp_t` values and the operators the kernels apply, element-wise and
//! on 16-byte packs. An operator has a `pre` step (applied once to each rank's own input: the
//! premulsum factor, avg's 1/n on floats), the binary `reduce`, and a `post` step applied once
//! to the final value (avg's division on integers).

use crate::arch::Pack16;
use crate::types::Elem;

/// `ncclRedOp_t`'s built-in values, plus PreMulSum (what a user op from
/// `ncclRedOpCreatePreMulSum` executes as).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOpKind {
    /// Sum.
    Sum = 0,
    /// Product.
    Prod = 1,
    /// Maximum.
    Max = 2,
    /// Minimum.
    Min = 3,
    /// Average (the sum divided by the number of ranks).
    Avg = 4,
    /// Each rank's input times a scalar, then summed.
    PreMulSum = 5,
}

impl RedOpKind {
    /// Every kind, in value order.
    pub const ALL: [RedOpKind; 6] = [
        RedOpKind::Sum,
        RedOpKind::Prod,
        RedOpKind::Max,
        RedOpKind::Min,
        RedOpKind::Avg,
        RedOpKind::PreMulSum,
    ];

    /// The kind's name as kernel names and tools spell it (`sum`, …, `premulsum`).
    pub fn name(self) -> &'static str {
        match self {
            RedOpKind::Sum => "sum",
            RedOpKind::Prod => "prod",
            RedOpKind::Max => "max",
            RedOpKind::Min => "min",
            RedOpKind::Avg => "avg",
            RedOpKind::PreMulSum => "premulsum",
        }
    }
}

/// A reduction operator instantiated for one launch from the scalar argument.
pub trait RedOp<T: Elem>: Copy + Send + Sync {
    const KIND: RedOpKind;
    fn new(arg: u64) -> Self;
    fn reduce(&self, a: T, b: T) -> T;
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn pre(&self, a: T) -> T {
        a
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn post(&self, a: T) -> T {
        a
    }
    /// Whether `pre` changes values (lets copies skip the per-element work).
    const HAS_PRE: bool = false;
    const HAS_POST: bool = false;
}

macro_rules! simple_op {
    ($name:ident, $kind:ident, $f:ident) => {
        #[derive(Clone, Copy)]
        pub struct $name;
        impl<T: Elem> RedOp<T> for $name {
            const KIND: RedOpKind = RedOpKind::$kind;
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn new(_: u64) -> Self {
                $name
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn reduce(&self, a: T, b: T) -> T {
                a.$f(b)
            }
        }
    };
}

simple_op!(Sum, Sum, add);
simple_op!(Prod, Prod, mul);
simple_op!(Max, Max, greater);
simple_op!(Min, Min, lesser);

/// `O` for values that already went through its `pre` (a partial sum kept in the output and
/// read back as an input): the same reduction and `post`, no second `pre`.
#[derive(Clone, Copy)]
pub struct Reduced<O>(pub O);
impl<T: Elem, O: RedOp<T>> RedOp<T> for Reduced<O> {
    const KIND: RedOpKind = O::KIND;
    const HAS_POST: bool = O::HAS_POST;
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn new(arg: u64) -> Self {
        Reduced(O::new(arg))
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn reduce(&self, a: T, b: T) -> T {
        self.0.reduce(a, b)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn post(&self, a: T) -> T {
        self.0.post(a)
    }
}

/// Sum after multiplying each rank's input by a scalar (bits of T in the argument).
#[derive(Clone, Copy)]
pub struct PreMulSum<T>(T);
impl<T: Elem> RedOp<T> for PreMulSum<T> {
    const KIND: RedOpKind = RedOpKind::PreMulSum;
    const HAS_PRE: bool = true;
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn new(arg: u64) -> Self {
        PreMulSum(T::from_bits(arg))
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn reduce(&self, a: T, b: T) -> T {
        a.add(b)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn pre(&self, a: T) -> T {
        a.mul(self.0)
    }
}

/// Average: the argument is the rank count. Floats multiply each input by 1/n first (so sums
/// stay in range); integers sum and divide the result.
#[derive(Clone, Copy)]
pub struct Avg<T> {
    n: u32,
    inv: T,
}
impl<T: Elem> RedOp<T> for Avg<T> {
    const KIND: RedOpKind = RedOpKind::Avg;
    const HAS_PRE: bool = T::IS_FLOAT;
    const HAS_POST: bool = !T::IS_FLOAT;
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn new(arg: u64) -> Self {
        let n = (arg as u32).max(1);
        Avg {
            n,
            inv: T::from_f64(1.0 / n as f64),
        }
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn reduce(&self, a: T, b: T) -> T {
        a.add(b)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn pre(&self, a: T) -> T {
        if T::IS_FLOAT {
            a.mul(self.inv)
        } else {
            a
        }
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn post(&self, a: T) -> T {
        if T::IS_FLOAT {
            a
        } else {
            a.div_count(self.n)
        }
    }
}

/// Elements of T in one 16-byte pack.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub const fn pack_elems<T>() -> usize {
    16 / core::mem::size_of::<T>()
}

/// Applies `f` lane by lane to the elements of two packs.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn map2<T: Elem>(a: Pack16, b: Pack16, f: impl Fn(T, T) -> T) -> Pack16 {
    let mut out = Pack16::default();
    let pa = &a as *const Pack16 as *const T;
    let pb = &b as *const Pack16 as *const T;
    let po = &mut out as *mut Pack16 as *mut T;
    for i in 0..pack_elems::<T>() {
        // SAFETY: i < 16 / size_of::<T>(), inside the 16-byte packs; T is plain data.
        unsafe { po.add(i).write(f(pa.add(i).read(), pb.add(i).read())) };
    }
    out
}

/// Applies `f` lane by lane to the elements of one pack.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn map1<T: Elem>(a: Pack16, f: impl Fn(T) -> T) -> Pack16 {
    map2::<T>(a, a, |x, _| f(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Bf16, F16};

    #[test]
    fn avg_divides_integers_and_premultiplies_floats() {
        let op = <Avg<i32> as RedOp<i32>>::new(4);
        let s = [10, 11, 12, 13]
            .iter()
            .fold(0, |acc, &v| op.reduce(acc, op.pre(v)));
        assert_eq!(op.post(s), 11);
        let op = <Avg<f32> as RedOp<f32>>::new(4);
        let s = [1.0f32, 2.0, 3.0, 6.0]
            .iter()
            .fold(0.0, |acc, &v| op.reduce(acc, op.pre(v)));
        assert_eq!(op.post(s), 3.0);
    }

    #[test]
    fn premulsum_uses_the_scalar_bits() {
        let op = <PreMulSum<f64> as RedOp<f64>>::new(2.5f64.to_bits());
        assert_eq!(op.reduce(op.pre(2.0), op.pre(4.0)), 15.0);
        let op = <PreMulSum<F16> as RedOp<F16>>::new(F16::from_f32(0.5).0 as u64);
        assert_eq!(op.pre(F16::from_f32(3.0)).to_f32(), 1.5);
    }

    #[test]
    fn packs_reduce_lane_by_lane() {
        let a = Pack16([1, 2, 3, 4]);
        let b = Pack16([10, 20, 30, u32::MAX]);
        assert_eq!(
            map2::<u32>(a, b, |x, y| <Sum as RedOp<u32>>::reduce(&Sum, x, y)).0,
            [11, 22, 33, 3]
        );
        let h = |x: f32| Bf16::from_f32(x).0 as u32;
        let a = Pack16([h(1.0) | (h(2.0) << 16), 0, 0, 0]);
        let r = map2::<Bf16>(a, a, |x, y| <Max as RedOp<Bf16>>::reduce(&Max, x, y));
        assert_eq!(r.0[0], a.0[0]);
    }
}
