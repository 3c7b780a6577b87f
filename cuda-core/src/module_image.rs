//! Bounds checks of module images before the driver reads them.
//!
//! `cuModuleLoadData` takes no length: it finds an image's size in its own headers (an ELF cubin's
//! section and program headers, a fatbin's header and entries), dereferences the pointer of a
//! fatbin *wrapper*, and reads anything else as NUL-terminated PTX text. Handed a truncated or
//! forged image from safe code, it would read past the end of the caller's bytes. So, before a
//! load:
//! - a binary image must be an ELF64 cubin or a fatbin whose every header, table, section,
//!   segment and entry lies inside it (string tables NUL-terminated, indices in range), and is
//!   copied to an 8-byte-aligned buffer with a zeroed tail;
//! - PTX text must not begin with a binary image's magic (ELF's `\x7fELF` is valid UTF-8).
//!
//! These checks bound every offset and size the formats declare in their headers; they do not
//! interpret section contents (which the driver reads relative to the sections checked here).

use crate::error::{Error, Result};

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// A fatbin entry whose payload is compressed (not an ELF image to check).
const FATBIN_FLAG_COMPRESSED: u64 = 0x2000;
const FATBIN_KIND_ELF: u16 = 2;

fn bad(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("module image refused before loading: {what}"))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or_else(|| bad("truncated header"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| bad("truncated header"))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    let s = b.get(at..at + 8).ok_or_else(|| bad("truncated header"))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

/// `offset..offset + size` as a range inside `len` bytes, or the refusal naming `what`.
fn span(offset: u64, size: u64, len: usize, what: &str) -> Result<std::ops::Range<usize>> {
    let end = offset.checked_add(size).filter(|&e| e <= len as u64);
    match end {
        Some(end) => Ok(offset as usize..end as usize),
        None => Err(bad(format!("{what} at {offset:#x}+{size:#x} runs past the image's {len} bytes"))),
    }
}

/// `Ok` when `image` is an ELF64 little-endian image whose headers, tables and sections all lie
/// inside it.
fn check_elf(image: &[u8]) -> Result<()> {
    let len = image.len();
    if len < 64 || image[4] != 2 || image[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF image"));
    }
    let (phoff, shoff) = (u64_at(image, 0x20)?, u64_at(image, 0x28)?);
    let (phentsize, phnum) = (u16_at(image, 0x36)? as u64, u16_at(image, 0x38)? as u64);
    let (shentsize, shnum) = (u16_at(image, 0x3a)? as u64, u16_at(image, 0x3c)? as u64);
    let shstrndx = u16_at(image, 0x3e)? as u64;
    if phnum > 0 {
        if phentsize < 56 {
            return Err(bad("ELF program header entries too small"));
        }
        span(phoff, phnum * phentsize, len, "the ELF program header table")?;
        for i in 0..phnum {
            let at = (phoff + i * phentsize) as usize;
            span(u64_at(image, at + 8)?, u64_at(image, at + 32)?, len, "an ELF segment")?;
        }
    }
    if shoff == 0 {
        return if shnum == 0 { Ok(()) } else { Err(bad("ELF sections without a table")) };
    }
    if shnum == 0 || shentsize < 64 || shstrndx >= shnum {
        return Err(bad("ELF section header table malformed (or extended numbering)"));
    }
    span(shoff, shnum * shentsize, len, "the ELF section header table")?;
    let header = |i: u64| (shoff + i * shentsize) as usize;
    let section = |i: u64| -> Result<(u32, std::ops::Range<usize>)> {
        let at = header(i);
        let ty = u32_at(image, at + 4)?;
        let (off, size) = (u64_at(image, at + 0x18)?, u64_at(image, at + 0x20)?);
        // SHT_NOBITS occupies no bytes of the image.
        let range = if ty == 8 { 0..0 } else { span(off, size, len, "an ELF section")? };
        Ok((ty, range))
    };
    let strtab = |i: u64| -> Result<std::ops::Range<usize>> {
        match section(i)? {
            (3, r) if !r.is_empty() && image[r.end - 1] == 0 => Ok(r),
            _ => Err(bad("an ELF string table is missing or not NUL-terminated")),
        }
    };
    let names = strtab(shstrndx)?;
    for i in 0..shnum {
        let at = header(i);
        let (ty, range) = section(i)?;
        if u32_at(image, at)? as usize >= names.len() {
            return Err(bad("an ELF section name lies outside the section name table"));
        }
        let (link, info) = (u32_at(image, at + 0x28)? as u64, u32_at(image, at + 0x2c)? as u64);
        if link >= shnum || (matches!(ty, 4 | 9) && info >= shnum) {
            return Err(bad("an ELF section links to a section that does not exist"));
        }
        if ty == 3 && !range.is_empty() && image[range.end - 1] != 0 {
            return Err(bad("an ELF string table is not NUL-terminated"));
        }
        if matches!(ty, 2 | 11) && !range.is_empty() {
            let entsize = u64_at(image, at + 0x38)? as usize;
            if entsize < 24 {
                return Err(bad("ELF symbol entries too small"));
            }
            let strs = strtab(link)?;
            let end = range.end;
            for sym in range.step_by(entsize).take_while(|s| s + 24 <= end) {
                let name = u32_at(image, sym)? as usize;
                let shndx = u16_at(image, sym + 6)? as u64;
                if name >= strs.len() || (shndx >= shnum && !(0xff00..0xffff).contains(&shndx)) {
                    return Err(bad("an ELF symbol names or points outside its tables"));
                }
            }
        }
    }
    Ok(())
}

/// `Ok` when `image` is a fatbin whose header and entries lie inside it, each uncompressed ELF
/// entry itself a valid ELF image.
fn check_fatbin(image: &[u8]) -> Result<()> {
    let header_size = u16_at(image, 6)? as u64;
    let fat_size = u64_at(image, 8)?;
    if header_size < 16 {
        return Err(bad("fatbin header too small"));
    }
    let body = span(header_size, fat_size, image.len(), "the fatbin's entries")?;
    let mut at = body.start;
    while at < body.end {
        let kind = u16_at(image, at)?;
        let entry_header = u32_at(image, at + 4)? as u64;
        let size = u64_at(image, at + 8)?;
        if entry_header < 16 {
            return Err(bad("fatbin entry header too small"));
        }
        let payload = span(at as u64 + entry_header, size, body.end, "a fatbin entry")?;
        let flags = if entry_header >= 0x30 { u64_at(image, at + 0x28)? } else { 0 };
        if kind == FATBIN_KIND_ELF && flags & FATBIN_FLAG_COMPRESSED == 0 {
            check_elf(&image[payload.clone()])?;
        }
        at = payload.end;
    }
    Ok(())
}

/// `image` checked (see the module docs) and copied to an 8-byte-aligned buffer with at least 8
/// zero bytes past its end, ready for `cuModuleLoadData`.
///
/// # Errors
/// [`Error::InvalidArgument`] for an empty image, one that is neither an ELF cubin nor a fatbin,
/// or one whose headers reach past its end.
pub(crate) fn checked_binary(image: &[u8]) -> Result<Vec<u64>> {
    if image.is_empty() {
        return Err(Error::InvalidArgument("empty CUBIN image".into()));
    }
    match image.get(..4) {
        Some(m) if m == ELF_MAGIC => check_elf(image)?,
        Some(m) if u32::from_le_bytes([m[0], m[1], m[2], m[3]]) == FATBIN_MAGIC => check_fatbin(image)?,
        _ => return Err(bad("neither an ELF cubin nor a fatbin (PTX text goes through from_ptx)")),
    }
    let mut aligned = vec![0u64; image.len() / 8 + 2];
    // SAFETY: `aligned` has more than image.len() bytes; the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast(), image.len()) };
    Ok(aligned)
}

/// `Ok` when `ptx` cannot be mistaken by the loader for a binary image (whose headers it would
/// trust).
///
/// # Errors
/// [`Error::InvalidArgument`] for text beginning with ELF's magic.
pub(crate) fn check_ptx(ptx: &str) -> Result<()> {
    if ptx.as_bytes().starts_with(ELF_MAGIC) {
        return Err(bad("PTX text begins with ELF's magic (load a cubin with from_cubin)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FATBIN: &[u8] = include_bytes!("../cuda/set_conditional.fatbin");

    fn refused(image: &[u8]) -> bool {
        matches!(checked_binary(image), Err(Error::InvalidArgument(_)))
    }

    /// The ELF images inside the shipped fatbin.
    fn elves() -> Vec<&'static [u8]> {
        let mut out = Vec::new();
        let mut at = 16;
        while at < FATBIN.len() {
            let h = u32_at(FATBIN, at + 4).unwrap() as usize;
            let n = u64_at(FATBIN, at + 8).unwrap() as usize;
            out.push(&FATBIN[at + h..at + h + n]);
            at += h + n;
        }
        out
    }

    #[test]
    fn real_images_pass_and_get_a_zero_tail() {
        let copy = checked_binary(FATBIN).unwrap();
        assert!(copy.len() * 8 >= FATBIN.len() + 8);
        // SAFETY: reading the u64s as bytes of the same total length.
        let bytes = unsafe { std::slice::from_raw_parts(copy.as_ptr().cast::<u8>(), copy.len() * 8) };
        assert_eq!(&bytes[..FATBIN.len()], FATBIN);
        assert!(bytes[FATBIN.len()..].iter().all(|&b| b == 0));
        let elves = elves();
        assert_eq!(elves.len(), 3);
        for elf in elves {
            checked_binary(elf).unwrap();
        }
    }

    /// Mutation caught: a loader fed the bytes unchecked (every prefix would be "accepted").
    #[test]
    fn truncated_images_are_refused() {
        for cut in [1, 4, 15, 16, 100, FATBIN.len() / 2, FATBIN.len() - 1] {
            assert!(refused(&FATBIN[..cut]), "fatbin cut at {cut}");
        }
        let elf = elves()[0];
        for cut in [4, 63, 64, 200, elf.len() / 2, elf.len() - 1] {
            assert!(refused(&elf[..cut]), "ELF cut at {cut}");
        }
    }

    #[test]
    fn forged_sizes_are_refused() {
        let mut fat = FATBIN.to_vec();
        fat[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // fat size: wraps if unchecked
        assert!(refused(&fat));
        let mut fat = FATBIN.to_vec();
        fat[16 + 8..16 + 16].copy_from_slice(&(1u64 << 40).to_le_bytes()); // first entry's size
        assert!(refused(&fat));
        let elf = elves()[0];
        for (field, value) in [(0x28usize, 1u64 << 40), (0x20, u64::MAX - 8)] {
            let mut e = elf.to_vec();
            e[field..field + 8].copy_from_slice(&value.to_le_bytes());
            assert!(refused(&e), "ELF header field {field:#x}");
        }
        // A section reaching past the end: the last section header's size.
        let mut e = elf.to_vec();
        let (shoff, shnum) = (u64_at(&e, 0x28).unwrap() as usize, u16_at(&e, 0x3c).unwrap() as usize);
        let last = shoff + (shnum - 1) * 64;
        if u32_at(&e, last + 4).unwrap() != 8 {
            let past = (e.len() as u64).to_le_bytes();
            e[last + 0x20..last + 0x28].copy_from_slice(&past);
            assert!(refused(&e));
        }
        // A section name table that is not NUL-terminated.
        let mut e = elf.to_vec();
        let names = shoff + u16_at(&e, 0x3e).unwrap() as usize * 64;
        let end = (u64_at(&e, names + 0x18).unwrap() + u64_at(&e, names + 0x20).unwrap()) as usize;
        e[end - 1] = b'x';
        assert!(refused(&e));
    }

    /// A fatbin wrapper holds a host pointer the loader would follow; garbage (no magic) would be
    /// read as PTX up to a NUL that may not be there.
    #[test]
    fn other_binaries_are_refused() {
        let mut wrapper = 0x466243b1u32.to_le_bytes().to_vec();
        wrapper.extend_from_slice(&[1, 0, 0, 0]);
        wrapper.extend_from_slice(&0xdead_beef_u64.to_le_bytes());
        wrapper.extend_from_slice(&[0; 8]);
        assert!(refused(&wrapper));
        assert!(refused(&[0xab; 64]));
        assert!(matches!(checked_binary(&[]), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn ptx_with_binary_magic_is_refused() {
        assert!(check_ptx("\u{7f}ELF\u{2}\u{1}\u{1}").is_err());
        assert!(check_ptx(".version 7.0\n.target sm_70\n").is_ok());
        assert!(check_ptx("").is_ok());
    }
}
