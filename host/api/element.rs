//! The element types collectives move: each maps to one NCCL `ncclDataType_t`.

use nccl_device::types::DataType;
pub use nccl_device::types::{F8E4M3, F8E5M2};

mod sealed {
    pub trait Sealed {}
}

/// A type whose values collectives move and reduce: `i8`, `u8`, `i32`, `u32`, `i64`, `u64`,
/// [`half::f16`], [`half::bf16`], `f32`, `f64` and the fp8 types [`F8E4M3`] and [`F8E5M2`].
///
/// The trait is sealed: its implementations are plain data with no padding for which every
/// bit pattern is a valid value, which is what lets device memory be copied into them.
///
/// # Safety
///
/// Implemented only in this crate, for the types above; `DATA_TYPE.size()` equals the type's
/// size.
pub unsafe trait Element: Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// The NCCL data type of this element.
    const DATA_TYPE: DataType;
    /// The value's bytes, little-endian, zero-extended to 64 bits (a PreMulSum scalar as the
    /// kernels read it).
    fn scalar_bits(self) -> u64;
}

macro_rules! element {
    ($t:ty, $dt:ident, $size:expr, |$v:ident| $bits:expr) => {
        impl sealed::Sealed for $t {}
        // SAFETY: a primitive (or transparent wrapper of one) of the data type's size; every
        // bit pattern is a value.
        unsafe impl Element for $t {
            const DATA_TYPE: DataType = DataType::$dt;
            fn scalar_bits(self) -> u64 {
                let $v = self;
                $bits
            }
        }
        const _: () = assert!(std::mem::size_of::<$t>() == $size);
    };
}

element!(i8, Int8, 1, |v| v as u8 as u64);
element!(u8, Uint8, 1, |v| v as u64);
element!(i32, Int32, 4, |v| v as u32 as u64);
element!(u32, Uint32, 4, |v| v as u64);
element!(i64, Int64, 8, |v| v as u64);
element!(u64, Uint64, 8, |v| v);
element!(half::f16, Float16, 2, |v| v.to_bits() as u64);
element!(half::bf16, Bfloat16, 2, |v| v.to_bits() as u64);
element!(f32, Float32, 4, |v| v.to_bits() as u64);
element!(f64, Float64, 8, |v| v.to_bits());
element!(F8E4M3, Float8e4m3, 1, |v| v.0 as u64);
element!(F8E5M2, Float8e5m2, 1, |v| v.0 as u64);

/// The bytes of `s` (what a host-to-device copy sends).
pub(crate) fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data without padding (see the trait); the byte slice
    // covers exactly `s` and borrows it.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of `s`, writable (what a device-to-host copy fills).
pub(crate) fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`, and every bit pattern is a valid Element value, so any bytes
    // written leave `s` valid.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_map_to_their_data_types() {
        assert_eq!(<half::bf16 as Element>::DATA_TYPE, DataType::Bfloat16);
        assert_eq!(<F8E5M2 as Element>::DATA_TYPE, DataType::Float8e5m2);
        assert_eq!((-1i8).scalar_bits(), 0xff);
        assert_eq!((-2i32).scalar_bits(), 0xffff_fffe);
        assert_eq!(1.5f32.scalar_bits(), 1.5f32.to_bits() as u64);
        assert_eq!(half::f16::from_f32(2.0).scalar_bits(), 0x4000);
        let v = [1u32, 0x0102_0304];
        assert_eq!(as_bytes(&v), &[1, 0, 0, 0, 4, 3, 2, 1]);
        let mut w = [0i32; 2];
        as_bytes_mut(&mut w).copy_from_slice(&[1, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(w, [1, 256]);
    }
}
