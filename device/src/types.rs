//! Element types: the `ncclDataType_t` values and their arithmetic. The 16- and 8-bit floats
//! compute in f32 and round back to nearest-even, which gives the correctly rounded result of
//! one operation (f32 carries more than twice their precision plus two bits).

/// `ncclDataType_t`, value for value.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

impl DataType {
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    pub fn from_raw(v: u32) -> Option<DataType> {
        DataType::ALL.get(v as usize).copied()
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        !matches!(
            self,
            DataType::Int8
                | DataType::Uint8
                | DataType::Int32
                | DataType::Uint32
                | DataType::Int64
                | DataType::Uint64
        )
    }

    /// The short name used in kernel names and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }
}

/// An element type the kernels reduce.
pub trait Elem: Copy + Default + PartialEq + core::fmt::Debug + Send + Sync + 'static {
    const DTYPE: DataType;
    const IS_FLOAT: bool;
    fn add(self, b: Self) -> Self;
    fn mul(self, b: Self) -> Self;
    fn lesser(self, b: Self) -> Self;
    fn greater(self, b: Self) -> Self;
    /// Division by a rank count (avg on integers; truncating like C).
    fn div_count(self, n: u32) -> Self;
    /// The nearest value to `v` (used for avg's 1/n factor on floats).
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// The element from the low bits of a scalar argument.
    fn from_bits(bits: u64) -> Self;
    fn to_bits(self) -> u64;
}

macro_rules! int_elem {
    ($t:ty, $d:ident, $u:ty) => {
        impl Elem for $t {
            const DTYPE: DataType = DataType::$d;
            const IS_FLOAT: bool = false;
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn add(self, b: Self) -> Self {
                self.wrapping_add(b)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn mul(self, b: Self) -> Self {
                self.wrapping_mul(b)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn lesser(self, b: Self) -> Self {
                core::cmp::min(self, b)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn greater(self, b: Self) -> Self {
                core::cmp::max(self, b)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn div_count(self, n: u32) -> Self {
                self.wrapping_div(n as $t)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn from_bits(bits: u64) -> Self {
                bits as $u as $t
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn to_bits(self) -> u64 {
                self as $u as u64
            }
        }
    };
}

int_elem!(i8, Int8, u8);
int_elem!(u8, Uint8, u8);
int_elem!(i32, Int32, u32);
int_elem!(u32, Uint32, u32);
int_elem!(i64, Int64, u64);
int_elem!(u64, Uint64, u64);

impl Elem for f32 {
    const DTYPE: DataType = DataType::Float32;
    const IS_FLOAT: bool = true;
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn add(self, b: Self) -> Self {
        self + b
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn mul(self, b: Self) -> Self {
        self * b
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn lesser(self, b: Self) -> Self {
        f32::min(self, b)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn greater(self, b: Self) -> Self {
        f32::max(self, b)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn div_count(self, n: u32) -> Self {
        self / n as f32
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn from_bits(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn to_bits(self) -> u64 {
        f32::to_bits(self) as u64
    }
}

impl Elem for f64 {
    const DTYPE: DataType = DataType::Float64;
    const IS_FLOAT: bool = true;
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn add(self, b: Self) -> Self {
        self + b
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn mul(self, b: Self) -> Self {
        self * b
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn lesser(self, b: Self) -> Self {
        f64::min(self, b)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn greater(self, b: Self) -> Self {
        f64::max(self, b)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn div_count(self, n: u32) -> Self {
        self / n as f64
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn to_f64(self) -> f64 {
        self
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn from_bits(bits: u64) -> Self {
        f64::from_bits(bits)
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn to_bits(self) -> u64 {
        f64::to_bits(self)
    }
}

/// A small float format: `e` exponent bits, `m` mantissa bits, IEEE-like (infinities, NaN with
/// an all-ones exponent) or, like e4m3, finite-only with a single NaN code per sign.
#[derive(Clone, Copy)]
struct Mini {
    e: u32,
    m: u32,
    ieee: bool,
    /// Out-of-range values saturate to the largest finite (CUDA's satfinite fp8 conversion).
    saturate: bool,
}

const HALF: Mini = Mini {
    e: 5,
    m: 10,
    ieee: true,
    saturate: false,
};
const E4M3: Mini = Mini {
    e: 4,
    m: 3,
    ieee: false,
    saturate: true,
};
const E5M2: Mini = Mini {
    e: 5,
    m: 2,
    ieee: true,
    saturate: true,
};

#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

impl Mini {
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn bias(self) -> i32 {
        (1 << (self.e - 1)) - 1
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn max_field(self) -> u32 {
        if self.ieee {
            (((1 << self.e) - 2) << self.m) | ((1 << self.m) - 1)
        } else {
            (((1 << self.e) - 1) << self.m) | ((1 << self.m) - 2)
        }
    }
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn nan(self) -> u32 {
        if self.ieee {
            (((1 << self.e) - 1) << self.m) | (1 << (self.m - 1))
        } else {
            (1 << (self.e + self.m)) - 1
        }
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn decode(self, v: u32) -> f32 {
        let sign = if v >> (self.e + self.m) & 1 != 0 {
            -1.0f32
        } else {
            1.0
        };
        let exp = (v >> self.m) & ((1 << self.e) - 1);
        let man = v & ((1 << self.m) - 1);
        let all_ones = (1 << self.e) - 1;
        if self.ieee && exp == all_ones {
            return if man == 0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            };
        }
        if !self.ieee && exp == all_ones && man == (1 << self.m) - 1 {
            return f32::NAN;
        }
        let mag = if exp == 0 {
            man as f32 * pow2(1 - self.bias() - self.m as i32)
        } else {
            ((1 << self.m) + man) as f32 * pow2(exp as i32 - self.bias() - self.m as i32)
        };
        sign * mag
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn encode(self, x: f32) -> u32 {
        let sign = (x.to_bits() >> 31) << (self.e + self.m);
        if x.is_nan() {
            return sign | self.nan();
        }
        let a = x.abs();
        let overflow = if self.saturate {
            self.max_field()
        } else if self.ieee {
            ((1 << self.e) - 1) << self.m
        } else {
            self.nan()
        };
        if a.is_infinite() {
            return sign
                | if self.ieee && !self.saturate {
                    overflow
                } else if self.saturate {
                    self.max_field()
                } else {
                    self.nan()
                };
        }
        let min_exp = 1 - self.bias();
        let exp = ((a.to_bits() >> 23) as i32) - 127;
        let mut q = if exp > min_exp { exp } else { min_exp } - self.m as i32;
        // a / 2^q < 2^(m+1): exact in f32, the integer part and the fraction give the rounding.
        let scaled = a * pow2(-q);
        let mut r = scaled as u32;
        let frac = scaled - r as f32;
        if frac > 0.5 || (frac == 0.5 && r & 1 == 1) {
            r += 1;
        }
        if r >= 1 << (self.m + 1) {
            r >>= 1;
            q += 1;
        }
        let field = if r < 1 << self.m {
            r
        } else {
            let biased = q + self.m as i32 + self.bias();
            ((biased as u32) << self.m) | (r - (1 << self.m))
        };
        if field > self.max_field() {
            return sign | overflow;
        }
        sign | field
    }
}

macro_rules! small_float {
    ($name:ident, $bits:ty, $d:ident, $to:expr, $from:expr) => {
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
        pub struct $name(pub $bits);

        impl $name {
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            pub fn to_f32(self) -> f32 {
                let f: fn($bits) -> f32 = $to;
                f(self.0)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            pub fn from_f32(x: f32) -> Self {
                let f: fn(f32) -> $bits = $from;
                $name(f(x))
            }
        }

        impl Elem for $name {
            const DTYPE: DataType = DataType::$d;
            const IS_FLOAT: bool = true;
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn add(self, b: Self) -> Self {
                Self::from_f32(self.to_f32() + b.to_f32())
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn mul(self, b: Self) -> Self {
                Self::from_f32(self.to_f32() * b.to_f32())
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn lesser(self, b: Self) -> Self {
                Self::from_f32(f32::min(self.to_f32(), b.to_f32()))
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn greater(self, b: Self) -> Self {
                Self::from_f32(f32::max(self.to_f32(), b.to_f32()))
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn div_count(self, n: u32) -> Self {
                Self::from_f32(self.to_f32() / n as f32)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn from_f64(v: f64) -> Self {
                Self::from_f32(v as f32)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn to_f64(self) -> f64 {
                self.to_f32() as f64
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn from_bits(bits: u64) -> Self {
                $name(bits as $bits)
            }
            #[cfg_attr(target_arch = "nvptx64", inline(always))]
            fn to_bits(self) -> u64 {
                self.0 as u64
            }
        }
    };
}

small_float!(
    F16,
    u16,
    Float16,
    |v| HALF.decode(v as u32),
    |x| HALF.encode(x) as u16
);
small_float!(
    Bf16,
    u16,
    Bfloat16,
    |v| f32::from_bits((v as u32) << 16),
    bf16_from_f32
);
small_float!(
    F8E4M3,
    u8,
    Float8e4m3,
    |v| E4M3.decode(v as u32),
    |x| E4M3.encode(x) as u8
);
small_float!(
    F8E5M2,
    u8,
    Float8e5m2,
    |v| E5M2.decode(v as u32),
    |x| E5M2.encode(x) as u8
);

#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn bf16_from_f32(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

/// Evaluates `$body` with the type alias `$T` bound to the Rust element type of the runtime
/// [`DataType`] `$dt` (host code that handles data of any type: tests, benchmarks, the simulator).
#[macro_export]
macro_rules! with_elem {
    ($dt:expr, $T:ident => $body:expr) => {{
        match $dt {
            $crate::types::DataType::Int8 => {
                type $T = i8;
                $body
            }
            $crate::types::DataType::Uint8 => {
                type $T = u8;
                $body
            }
            $crate::types::DataType::Int32 => {
                type $T = i32;
                $body
            }
            $crate::types::DataType::Uint32 => {
                type $T = u32;
                $body
            }
            $crate::types::DataType::Int64 => {
                type $T = i64;
                $body
            }
            $crate::types::DataType::Uint64 => {
                type $T = u64;
                $body
            }
            $crate::types::DataType::Float16 => {
                type $T = $crate::types::F16;
                $body
            }
            $crate::types::DataType::Float32 => {
                type $T = f32;
                $body
            }
            $crate::types::DataType::Float64 => {
                type $T = f64;
                $body
            }
            $crate::types::DataType::Bfloat16 => {
                type $T = $crate::types::Bf16;
                $body
            }
            $crate::types::DataType::Float8e4m3 => {
                type $T = $crate::types::F8E4M3;
                $body
            }
            $crate::types::DataType::Float8e5m2 => {
                type $T = $crate::types::F8E5M2;
                $body
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trips_every_value() {
        for v in 0u32..=0xffff {
            let f = HALF.decode(v);
            if f.is_nan() {
                assert!(F16::from_f32(f).to_f32().is_nan());
                continue;
            }
            assert_eq!(HALF.encode(f), v, "half {v:#06x} = {f}");
        }
    }

    #[test]
    fn half_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and the next half (1 + 2^-10): ties to even gives 1.
        assert_eq!(F16::from_f32(1.0 + 2f32.powi(-11)).0, 0x3c00);
        assert_eq!(F16::from_f32(1.0 + 3.0 * 2f32.powi(-11)).0, 0x3c02);
        assert_eq!(F16::from_f32(65504.0).0, 0x7bff);
        assert_eq!(
            F16::from_f32(65520.0).0,
            0x7c00,
            "overflow rounds to infinity"
        );
        assert_eq!(
            F16::from_f32(2f32.powi(-24)).0,
            0x0001,
            "smallest subnormal"
        );
        assert_eq!(F16::from_f32(2f32.powi(-26)).0, 0x0000);
        assert_eq!(F16::from_f32(-2.5).to_f32(), -2.5);
    }

    #[test]
    fn fp8_formats() {
        for v in 0u32..=0xff {
            for fmt in [E4M3, E5M2] {
                let f = fmt.decode(v);
                if !f.is_nan() && f.is_finite() {
                    assert_eq!(fmt.encode(f), v, "fp8 {v:#04x} = {f}");
                }
            }
        }
        assert_eq!(F8E4M3::from_f32(448.0).to_f32(), 448.0);
        assert_eq!(F8E4M3::from_f32(1e6).to_f32(), 448.0, "e4m3 saturates");
        assert_eq!(F8E5M2::from_f32(57344.0).to_f32(), 57344.0);
        assert_eq!(F8E5M2::from_f32(1e9).to_f32(), 57344.0, "e5m2 saturates");
        assert!(F8E4M3::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        assert_eq!(Bf16::from_f32(1.0 + 2f32.powi(-8)).0, 0x3f80, "tie to even");
        assert_eq!(Bf16::from_f32(1.0 + 3.0 * 2f32.powi(-8)).0, 0x3f82);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn integer_arithmetic_wraps() {
        assert_eq!(Elem::add(i8::MAX, 1), i8::MIN);
        assert_eq!(Elem::mul(200u8, 2), 144);
        assert_eq!(Elem::div_count(-7i32, 2), -3);
        assert_eq!(<u64 as Elem>::from_bits(u64::MAX), u64::MAX);
        assert_eq!(<i8 as Elem>::from_bits(0xff), -1);
    }
}
