//! Which CPU kernels run, chosen once at run time for the CPU at hand.
//!
//! One choice, [`Kernels`], covers the quantized matmuls (`engine::cpu::qlinear`) and the
//! attention (`engine::cpu::attention`). The instruction set is detected at run time
//! ([`Isa::detect`]) and each SIMD kernel is entered through a `#[target_feature]`
//! function, so a binary built for a generic x86-64 (a release for distribution, an Apple
//! target) runs the same kernels as one built with `-C target-cpu=native`.

/// The kernels a model runs with (`--kernel`, or `POCKETCHAT_KERNELS` read by main).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// pocketchat's kernels (Q4_1, Q8_0 and Q4_K matmuls, attention) at the best instruction set
    /// this CPU has; candle's for everything else.
    #[default]
    Fast,
    /// pocketchat's kernels at AVX2 (+ FMA, F16C) even where the CPU has AVX-512 or
    /// AVX-VNNI: the path of the many x86-64 machines without them, to measure and test
    /// it on one that has them (`--kernel avx2`). x86-64 only.
    Avx2,
    /// pocketchat's kernels in portable Rust with no SIMD instructions of their own
    /// (checks, and CPUs without AVX2 or NEON).
    Portable,
    /// candle's for everything: the reference the others are tested against.
    Candle,
}

impl Kernels {
    pub const NAMES: &'static str = "fast, avx2, portable, candle";

    pub fn parse(name: &str) -> Option<Kernels> {
        match name.trim() {
            "fast" => Some(Kernels::Fast),
            "avx2" => Some(Kernels::Avx2),
            "portable" => Some(Kernels::Portable),
            "candle" => Some(Kernels::Candle),
            _ => None,
        }
    }

    /// The instruction set pocketchat's kernels use under this choice; `None` when
    /// candle's run instead.
    pub(crate) fn isa(self) -> Option<Isa> {
        match self {
            Kernels::Fast => Some(Isa::detect()),
            // `Kernels::available` refuses it where the CPU lacks AVX2.
            Kernels::Avx2 => Some(Isa::Avx2),
            Kernels::Portable => Some(Isa::Scalar),
            Kernels::Candle => None,
        }
    }

    /// What runs, for logs and the bench: "fast (Avx512Vnni)".
    pub fn describe(self) -> String {
        match self.isa() {
            Some(isa) => format!("{} ({isa:?})", self.name()),
            None => self.name().to_string(),
        }
    }

    /// Whether this CPU can run the choice: `Err` with a sentence for the user if not.
    pub fn available(self) -> Result<Kernels, String> {
        match self {
            Kernels::Avx2 if !Isa::detect().has_avx2() => {
                Err("the avx2 kernels need an x86-64 CPU with AVX2, FMA and F16C".to_string())
            }
            k => Ok(k),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernels::Fast => "fast",
            Kernels::Avx2 => "avx2",
            Kernels::Portable => "portable",
            Kernels::Candle => "candle",
        }
    }
}

/// Instruction set a kernel is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)] // each architecture constructs only its own variants
pub(crate) enum Isa {
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-VNNI `vpdpbusd`.
    AvxVnni,
    /// [`Isa::Avx2`] plus AVX-512 F/BW/VNNI: 512-bit Q4_1 tiles (Q8_0 keeps the 256-bit
    /// kernel, with AVX-VNNI where the CPU has it).
    Avx512Vnni,
    /// aarch64 NEON.
    Neon,
    /// NEON plus the `sdot` dot-product instruction.
    NeonDot,
}

impl Isa {
    /// The best instruction set this CPU supports (detected once).
    pub(crate) fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                {
                    if is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vnni")
                    {
                        return Isa::Avx512Vnni;
                    }
                    if is_x86_feature_detected!("avxvnni") {
                        return Isa::AvxVnni;
                    }
                    return Isa::Avx2;
                }
            }
            #[cfg(target_arch = "aarch64")]
            {
                if std::arch::is_aarch64_feature_detected!("neon") {
                    if std::arch::is_aarch64_feature_detected!("dotprod") {
                        return Isa::NeonDot;
                    }
                    return Isa::Neon;
                }
            }
            Isa::Scalar
        })
    }

    /// Whether kernels written for [`Isa::Avx2`] run on this instruction set.
    pub(crate) fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni)
    }

    /// Every instruction set this CPU can run, best first (for tests).
    #[cfg(test)]
    pub(crate) fn all_supported() -> Vec<Isa> {
        let best = Isa::detect();
        let mut v = vec![best];
        match best {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni if is_x86_feature_detected!("avxvnni") => v.extend([Isa::AvxVnni, Isa::Avx2]),
            Isa::Avx512Vnni | Isa::AvxVnni => v.push(Isa::Avx2),
            Isa::NeonDot => v.push(Isa::Neon),
            _ => {}
        }
        if best != Isa::Scalar {
            v.push(Isa::Scalar);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in [Kernels::Fast, Kernels::Avx2, Kernels::Portable, Kernels::Candle] {
            assert_eq!(Kernels::parse(k.name()), Some(k));
        }
        assert_eq!(Kernels::parse("scalar"), None);
        assert_eq!(Kernels::Portable.isa(), Some(Isa::Scalar));
        assert_eq!(Kernels::Candle.isa(), None);
        assert_eq!(Kernels::Avx2.isa(), Some(Isa::Avx2));
        assert_eq!(Kernels::Avx2.available().is_ok(), Isa::detect().has_avx2());
    }
}
