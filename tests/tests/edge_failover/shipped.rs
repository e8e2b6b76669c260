//! The shipped proxy guides and edge units load in their engines.

use super::*;

/// The customer-proxy guides of docs/proxy/ load in the real servers (nginx, Caddy, Apache
/// httpd), and the edge's systemd units pass `systemd-analyze verify` (with their paths pointed
/// at this checkout). Nothing is started and no name is resolved.
#[test]
fn proxy_guides_and_edge_units_load_in_their_engines() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let guide = |name: &str| std::fs::read_to_string(root().join("docs/proxy").join(name)).unwrap();

    let nginx = format!(
        "daemon off;\npid {p}/nginx.pid;\nerror_log {p}/nginx-error.log;\nevents {{}}\n\
         http {{\n  access_log off;\n  server {{\n    listen 127.0.0.1:9;\n{}\n  }}\n}}\n",
        guide("nginx-dns.conf"),
        p = d.display()
    );
    std::fs::write(d.join("nginx.conf"), nginx).unwrap();
    process::output_of(
        "nginx -t with docs/proxy/nginx-dns.conf",
        Command::new("nginx")
            .args(["-t", "-p"])
            .arg(d)
            .arg("-c")
            .arg(d.join("nginx.conf")),
    );

    let caddy = format!(
        "{{\n\tadmin off\n\tauto_https off\n}}\nhttp://127.0.0.1:9 {{\n{}\n}}\n",
        guide("Caddyfile-dns")
    );
    std::fs::write(d.join("Caddyfile"), caddy).unwrap();
    process::output_of(
        "caddy validate with docs/proxy/Caddyfile-dns",
        Command::new("caddy")
            .args(["validate", "--adapter", "caddyfile", "--config"])
            .arg(d.join("Caddyfile"))
            .env("HOME", d)
            .env("XDG_DATA_HOME", d)
            .env("XDG_CONFIG_HOME", d),
    );

    apache_loads_its_guide(d, guide("apache-dns.conf"));
    edge_units_verify(d);
}

/// Apache httpd (`apache2 -t`) loads `guide` (docs/proxy/apache-dns.conf) in a virtual host,
/// its files in `d`.
fn apache_loads_its_guide(d: &std::path::Path, guide: String) {
    let modules = [
        "mpm_event",
        "authz_core",
        "proxy",
        "proxy_http",
        "socache_shmcb",
        "ssl",
        "headers",
    ]
    .map(|m| format!("Include mods-available/{m}.load\n"))
    .concat();
    let httpd = format!(
        "ServerRoot /etc/apache2\nServerName localhost\nPidFile {p}/httpd.pid\n\
         ErrorLog {p}/httpd-error.log\n{modules}Listen 127.0.0.1:9\n\
         <VirtualHost 127.0.0.1:9>\n{}\n</VirtualHost>\n",
        guide,
        p = d.display()
    );
    std::fs::write(d.join("httpd.conf"), httpd).unwrap();
    let out = process::output_of(
        "apache2 -t with docs/proxy/apache-dns.conf",
        Command::new("apache2")
            .arg("-t")
            .arg("-f")
            .arg(d.join("httpd.conf")),
    );
    assert!(out.contains("Syntax OK"), "apache2 -t said:\n{out}");
}

/// The edge's systemd units, as installed (/etc/collector-edge = deploy/edge,
/// /etc/default/collector-edge = the example environment, copied into `d`), pass
/// `systemd-analyze verify`; the proxy's restarts as requirement 2 asks.
fn edge_units_verify(d: &std::path::Path) {
    let edge = root().join("deploy/edge");
    std::fs::copy(edge.join("edge.env.example"), d.join("collector-edge.env")).unwrap();
    let mut units = Vec::new();
    for unit in [
        "collector-edge-haproxy.service",
        "collector-edge-keepalived.service",
    ] {
        let text = std::fs::read_to_string(edge.join(unit))
            .unwrap()
            .replace("/etc/collector-edge/", &format!("{}/", edge.display()))
            .replace(
                "/etc/default/collector-edge",
                d.join("collector-edge.env").to_str().unwrap(),
            );
        // What requirement 2 asks of the proxy's unit.
        if unit.contains("haproxy") {
            for line in ["Restart=always", "RestartSec=5"] {
                assert!(text.lines().any(|l| l == line), "{unit} lacks {line}");
            }
        }
        std::fs::write(d.join(unit), text).unwrap();
        units.push(d.join(unit));
    }
    process::output_of(
        "systemd-analyze verify deploy/edge/*.service",
        Command::new("systemd-analyze").arg("verify").args(&units),
    );
}
