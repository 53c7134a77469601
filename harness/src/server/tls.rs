//! Test-only TLS material: a throwaway CA and a server certificate for `127.0.0.1`/`localhost`,
//! made with the `openssl` command-line tool.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::HarnessError;

/// Paths of the generated PEM files.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub(crate) ca_cert: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
}

/// Writes `ca.crt`, `ca.key`, `server.crt`, `server.key` into `dir`.
///
/// EC P-256 keys keep generation in the tens of milliseconds.
pub(crate) fn generate(dir: &Path) -> Result<TlsFiles, HarnessError> {
    let files = TlsFiles {
        ca_cert: dir.join("ca.crt"),
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
    };
    let ca_key = dir.join("ca.key");
    let csr = dir.join("server.csr");
    let ext = dir.join("server.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(HarnessError::io("writing the TLS extension file"))?;

    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        "create the test CA",
        &[
            &["req", "-x509", "-new"][..],
            &ec[..],
            &["-days", "2", "-subj", "/CN=Slate test CA"],
        ]
        .concat(),
        &[("-keyout", &ca_key), ("-out", &files.ca_cert)],
    )?;
    openssl(
        dir,
        "create the server key and CSR",
        &[&["req", "-new"][..], &ec[..], &["-subj", "/CN=localhost"]].concat(),
        &[("-keyout", &files.server_key), ("-out", &csr)],
    )?;
    openssl(
        dir,
        "sign the server certificate",
        &["x509", "-req", "-days", "2", "-set_serial", "1"],
        &[
            ("-in", &csr),
            ("-CA", &files.ca_cert),
            ("-CAkey", &ca_key),
            ("-extfile", &ext),
            ("-out", &files.server_cert),
        ],
    )?;
    Ok(files)
}

fn openssl(
    dir: &Path,
    what: &str,
    args: &[&str],
    paths: &[(&str, &PathBuf)],
) -> Result<(), HarnessError> {
    let mut cmd = Command::new("openssl");
    cmd.current_dir(dir).args(args);
    for (flag, path) in paths {
        cmd.arg(flag).arg(path);
    }
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
        HarnessError::Tls(format!(
            "cannot run the openssl CLI to {what} ({e}); install it with \"apt-get install -y openssl\""
        ))
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Tls(format!(
            "openssl failed to {what} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
