//! podman 4.3, called with the flags this machine needs (ENVIRONMENT.md).

use super::*;
use std::ffi::OsStr;
use std::process::Output;

/// `podman ARGS` with the flags this machine needs (ENVIRONMENT.md): for `run` and `create`,
/// `--runtime runc` unless the caller gives `--runtime`, and
/// `--ulimit nofile=1024:1024 --ulimit nproc=4096:4096` (podman's default rlimits exceed this
/// machine's hard limits).
pub fn podman<S: AsRef<OsStr>>(args: &[S]) -> Output {
    podman_with_env(args, &[])
}

/// [`podman`] with extra environment variables for podman (and so for conmon and the runtime).
pub fn podman_with_env<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &OsStr)]) -> Output {
    command_output("podman", &podman_args(args), env)
}

/// The argument list [`podman`] runs: for `run` and `create` (the first such word), `--runtime
/// runc` unless `--runtime` is given, and the `--ulimit` flags, inserted after that word.
pub fn podman_args<S: AsRef<OsStr>>(args: &[S]) -> Vec<std::ffi::OsString> {
    let args: Vec<&OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let Some(pos) = args.iter().position(|a| *a == "run" || *a == "create") else {
        return args.iter().map(|a| a.to_os_string()).collect();
    };
    let mut full: Vec<&OsStr> = args[..=pos].to_vec();
    if !args.iter().any(|a| *a == "--runtime" || a.to_string_lossy().starts_with("--runtime=")) {
        full.extend([OsStr::new("--runtime"), OsStr::new("runc")]);
    }
    full.extend(["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"].map(OsStr::new));
    full.extend(&args[pos + 1..]);
    full.into_iter().map(|a| a.to_os_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: Vec<std::ffi::OsString>) -> Vec<String> {
        v.into_iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn podman_run_gets_runc_and_the_ulimits_this_machine_needs() {
        assert_eq!(
            strs(podman_args(&["run", "--rm", "img", "true"])),
            [
                "run",
                "--runtime",
                "runc",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=4096:4096",
                "--rm",
                "img",
                "true"
            ]
        );
    }

    #[test]
    fn podman_keeps_a_given_runtime_and_leaves_other_commands_alone() {
        let a = strs(podman_args(&["run", "--runtime", "/x/actk-runtime", "img"]));
        assert_eq!(a.iter().filter(|s| *s == "--runtime").count(), 1, "{a:?}");
        assert!(a.contains(&"/x/actk-runtime".to_string()) && a.contains(&"nofile=1024:1024".to_string()), "{a:?}");
        assert_eq!(strs(podman_args(&["image", "inspect", "img"])), ["image", "inspect", "img"]);
    }

    #[test]
    fn actk_config_toml_quotes_paths_and_lists() {
        let c = ActkConfig::new(Path::new("/tmp/a \"b\"")).unwrap();
        let t = c.toml();
        assert!(t.starts_with("root = \"/tmp/a \\\"b\\\"\"\n"), "{t}");
        assert!(t.contains("runtimes = [\"runc\"]\n"), "{t}");
    }
}
