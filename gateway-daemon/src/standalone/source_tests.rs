//! The manifest source over a real directory: objects a new version of a file leaves
//! out, or a file gone, linger for the settle time, and go at once when another file
//! takes them.

use std::{path::PathBuf, time::Duration};

use super::source::ManifestSource;

fn route(name: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
         metadata: {{name: {name}, namespace: a}}\nspec: {{}}\n"
    )
}

/// The routes in force, by name, sorted (after checking that the snapshot patched
/// file by file is the one made afresh).
fn routes(source: &mut ManifestSource) -> Vec<String> {
    assert_eq!(
        source.snapshot(),
        &source.rebuilt(),
        "the snapshot patched file by file differs from one made afresh"
    );
    let mut names: Vec<String> = source
        .snapshot()
        .routes
        .iter()
        .map(|r| r.metadata.name.to_string())
        .collect();
    names.sort();
    names
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("berth-source-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    Dir(d)
}

#[test]
fn an_emptied_file_keeps_its_objects_until_the_settle_time() {
    let d = dir("empty");
    let file = d.0.join("a.yaml");
    std::fs::write(&file, route("x") + &route("y")).expect("write");
    let mut source = ManifestSource::new(&d.0, Duration::from_millis(300));
    source.refresh().expect("refresh");
    assert_eq!(routes(&mut source), ["x", "y"]);

    std::fs::write(&file, "").expect("truncate");
    let (changed, errors) = source.refresh().expect("refresh");
    assert!(changed && errors.is_empty(), "{errors:?}");
    assert_eq!(
        routes(&mut source),
        ["x", "y"],
        "right after the truncation"
    );

    std::fs::write(&file, route("x")).expect("write");
    source.refresh().expect("refresh");
    assert_eq!(
        routes(&mut source),
        ["x", "y"],
        "y left out, within the settle time"
    );
    std::thread::sleep(Duration::from_millis(350));
    let (changed, _) = source.refresh().expect("refresh");
    assert!(changed, "y's going is a change");
    assert_eq!(routes(&mut source), ["x"], "y gone after the settle time");
}

#[test]
fn an_object_moved_to_another_file_is_taken_from_there_at_once() {
    let d = dir("moved");
    std::fs::write(d.0.join("a.yaml"), route("x") + &route("y")).expect("write");
    let mut source = ManifestSource::new(&d.0, Duration::from_secs(3600));
    source.refresh().expect("refresh");

    std::fs::write(d.0.join("a.yaml"), route("x")).expect("write");
    std::fs::write(d.0.join("b.yaml"), route("y")).expect("write");
    let (_, errors) = source.refresh().expect("refresh");
    assert!(errors.is_empty(), "y defined once: {errors:?}");
    assert!(source.broken().is_empty(), "{:?}", source.broken());
    assert_eq!(routes(&mut source), ["x", "y"]);
    // The other way round: z.yaml has w first and waits for a.yaml's definition; when
    // a.yaml leaves it out (it lingers there), z.yaml takes it at once.
    std::fs::write(d.0.join("a.yaml"), route("x") + &route("w")).expect("write");
    source.refresh().expect("refresh");
    std::fs::write(d.0.join("z.yaml"), route("w")).expect("write");
    let (_, errors) = source.refresh().expect("refresh");
    assert!(!errors.is_empty(), "w defined twice");
    std::fs::write(d.0.join("a.yaml"), route("x")).expect("write");
    source.refresh().expect("refresh");
    assert!(source.broken().is_empty(), "{:?}", source.broken());
    assert_eq!(routes(&mut source), ["w", "x", "y"]);
    // b.yaml's y is the one in force (a.yaml no longer holds it): b.yaml gone and
    // c.yaml with y, c.yaml takes it at once.
    std::fs::remove_file(d.0.join("b.yaml")).expect("rm");
    std::fs::write(d.0.join("c.yaml"), route("y")).expect("write");
    let (_, errors) = source.refresh().expect("refresh");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(routes(&mut source), ["w", "x", "y"]);
}

#[test]
fn a_renamed_file_is_taken_at_once_and_its_old_name_goes_quietly() {
    let d = dir("renamed");
    std::fs::write(d.0.join("a.yaml"), route("x") + &route("y")).expect("write");
    let mut source = ManifestSource::new(&d.0, Duration::from_millis(300));
    source.refresh().expect("refresh");

    std::fs::rename(d.0.join("a.yaml"), d.0.join("b.yaml")).expect("mv");
    let (_, errors) = source.refresh().expect("refresh");
    assert!(errors.is_empty(), "nothing defined twice: {errors:?}");
    assert_eq!(routes(&mut source), ["x", "y"]);
    std::thread::sleep(Duration::from_millis(350));
    source.refresh().expect("refresh");
    assert!(source.broken().is_empty(), "{:?}", source.broken());
    assert_eq!(
        routes(&mut source),
        ["x", "y"],
        "a.yaml's going takes nothing"
    );
}

#[test]
fn a_change_of_the_directory_is_pending_until_the_watch_waits_for_it() {
    let d = dir("pending");
    let watch = super::DirWatch::new(&d.0);
    assert!(!watch.pending(None), "nothing written yet");
    std::fs::write(d.0.join("a.yaml"), route("x")).expect("write");
    assert!(watch.pending(None), "a file written");
    assert!(watch.pending(None), "still, until a wait takes it");
    watch.wait(Duration::from_millis(10), None);
    assert!(!watch.pending(None), "taken by the wait");
}

#[test]
fn what_a_read_ahead_found_is_reported_by_the_next_refresh() {
    let d = dir("ahead");
    std::fs::write(d.0.join("a.yaml"), route("x")).expect("write");
    std::fs::write(d.0.join("b.yaml"), "kind: [").expect("write");
    let mut source = ManifestSource::new(&d.0, Duration::from_millis(300));
    source.read_ahead();
    assert_eq!(routes(&mut source), ["x"], "read ahead");
    // A file written after the read ahead is read by the refresh too.
    std::fs::write(d.0.join("c.yaml"), route("z")).expect("write");
    let (changed, errors) = source.refresh().expect("refresh");
    assert!(changed, "the files read ahead are a change");
    assert_eq!(errors.len(), 1, "b.yaml's error, once: {errors:?}");
    assert!(errors[0].contains("b.yaml"), "{errors:?}");
    assert_eq!(routes(&mut source), ["x", "z"]);
    let (changed, errors) = source.refresh().expect("refresh");
    assert!(!changed && errors.is_empty(), "reported once: {errors:?}");
}

fn service(name: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: a}}\n\
         spec: {{ports: [{{port: 80}}]}}\n"
    )
}

#[test]
fn the_snapshot_follows_files_changed_broken_waiting_and_removed() {
    let d = dir("follows");
    let write = |name: &str, text: String| std::fs::write(d.0.join(name), text).expect("write");
    write("a.yaml", route("a1") + &service("s1") + &route("a2"));
    write("b.yaml", service("s2") + &route("b1"));
    write("c.yaml", route("c1") + &service("s3"));
    let mut source = ManifestSource::new(&d.0, Duration::from_millis(200));
    source.refresh().expect("refresh");
    assert_eq!(routes(&mut source), ["a1", "a2", "b1", "c1"]);
    let services = |source: &ManifestSource| -> Vec<String> {
        let s = source.snapshot();
        s.services
            .iter()
            .map(|s| s.metadata.name.to_string())
            .collect()
    };
    assert_eq!(services(&source), ["s1", "s2", "s3"], "in file order");

    // The middle file grows and shrinks by kind; the first breaks (its objects stay).
    write(
        "b.yaml",
        route("b0") + &service("s2") + &service("s2b") + &route("b1"),
    );
    write("a.yaml", "kind: [".to_string());
    let (_, errors) = source.refresh().expect("refresh");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(routes(&mut source), ["a1", "a2", "b0", "b1", "c1"]);
    assert_eq!(services(&source), ["s1", "s2", "s2b", "s3"]);

    // d.yaml defines c1 again and waits; c.yaml gone, then d.yaml is admitted.
    write("d.yaml", route("c1") + &route("d1"));
    let (_, errors) = source.refresh().expect("refresh");
    assert!(!errors.is_empty(), "c1 defined twice");
    assert_eq!(routes(&mut source), ["a1", "a2", "b0", "b1", "c1"]);
    std::fs::remove_file(d.0.join("c.yaml")).expect("rm");
    source.refresh().expect("refresh");
    assert_eq!(
        routes(&mut source),
        ["a1", "a2", "b0", "b1", "c1"],
        "settling"
    );
    std::thread::sleep(Duration::from_millis(250));
    source.refresh().expect("refresh");
    assert_eq!(routes(&mut source), ["a1", "a2", "b0", "b1", "c1", "d1"]);
    assert_eq!(
        services(&source),
        ["s1", "s2", "s2b"],
        "s3 went with c.yaml"
    );
    assert!(
        source.broken().iter().all(|e| e.contains("a.yaml")),
        "{:?}",
        source.broken()
    );
}

fn names(names: &[&str]) -> super::Look {
    super::Look::Names(names.iter().map(std::ffi::OsString::from).collect())
}

#[test]
fn a_look_at_named_files_reads_those_and_leaves_the_rest_as_they_were() {
    let d = dir("named");
    let write = |name: &str, text: String| std::fs::write(d.0.join(name), text).expect("write");
    write("a.yaml", route("a1"));
    write("b.yaml", route("b1"));
    let mut source = ManifestSource::new(&d.0, Duration::from_millis(200));
    source.refresh().expect("refresh");

    write("a.yaml", route("a1") + &route("a2"));
    write("b.yaml", route("b1") + &route("b2"));
    write("c.yaml", route("c1"));
    let (changed, _) = source
        .refresh_looking(names(&["b.yaml", "c.yaml"]))
        .expect("look");
    assert!(changed);
    assert_eq!(
        routes(&mut source),
        ["a1", "b1", "b2", "c1"],
        "a.yaml not looked at"
    );
    let (changed, _) = source.refresh_looking(names(&[])).expect("look");
    assert!(!changed, "nothing named, nothing read");

    // A named file gone, or a directory by a manifest's name: gone, for the settle time.
    std::fs::remove_file(d.0.join("b.yaml")).expect("rm");
    std::fs::remove_file(d.0.join("c.yaml")).expect("rm");
    std::fs::create_dir(d.0.join("c.yaml")).expect("mkdir");
    source
        .refresh_looking(names(&["b.yaml", "c.yaml"]))
        .expect("look");
    assert_eq!(routes(&mut source), ["a1", "b1", "b2", "c1"], "settling");
    std::thread::sleep(Duration::from_millis(250));
    let (changed, _) = source.refresh_looking(names(&[])).expect("look");
    assert!(changed, "the settle time ends without a look at the files");
    assert_eq!(routes(&mut source), ["a1"]);
    source.refresh().expect("refresh");
    assert_eq!(
        routes(&mut source),
        ["a1", "a2"],
        "a look at all finds a.yaml's change"
    );
}

#[test]
fn the_watch_names_the_manifests_written_and_looks_at_all_for_links_and_directories() {
    let d = dir("look");
    let watch = super::DirWatch::new(&d.0);
    assert_eq!(
        watch.take_look(),
        super::Look::All,
        "no event: a look at all"
    );
    // Written aside, then renamed: only the manifest is named.
    std::fs::write(d.0.join("a.tmp"), route("x")).expect("write");
    std::fs::rename(d.0.join("a.tmp"), d.0.join("a.yaml")).expect("mv");
    std::fs::write(d.0.join("b.json"), "{}").expect("write");
    std::fs::remove_file(d.0.join("b.json")).expect("rm");
    watch.wait(Duration::from_secs(1), None);
    assert_eq!(watch.take_look(), names(&["a.yaml", "b.json"]));
    assert_eq!(watch.take_look(), super::Look::All, "taken");
    // A ConfigMap volume's update: a new directory and a link swapped.
    std::fs::create_dir(d.0.join("..2026_12_06")).expect("mkdir");
    watch.wait(Duration::from_secs(1), None);
    assert_eq!(watch.take_look(), super::Look::All, "a directory");
    std::os::unix::fs::symlink("..2026_12_06", d.0.join("..data")).expect("ln");
    std::fs::write(d.0.join("c.yaml"), route("y")).expect("write");
    watch.wait(Duration::from_secs(1), None);
    assert_eq!(watch.take_look(), super::Look::All, "a link");
}

#[test]
fn a_file_read_again_keeps_its_unchanged_objects_as_the_same_allocations() {
    let d = dir("shared");
    let file = d.0.join("a.yaml");
    std::fs::write(&file, route("x") + &route("y")).expect("write");
    let mut source = ManifestSource::new(&d.0, Duration::from_secs(5));
    source.refresh().expect("refresh");
    let before = source.snapshot().routes.clone();
    // y's spec changes (and the file's length with it); x is as it was.
    let y = route("y").replace("spec: {}", "spec: {parentRefs: [{name: gw}]}");
    std::fs::write(&file, route("x") + &y).expect("write");
    let (changed, _) = source.refresh().expect("refresh");
    assert!(changed);
    let after = &source.snapshot().routes;
    assert!(
        std::sync::Arc::ptr_eq(&before[0], &after[0]),
        "x unchanged: the same allocation"
    );
    assert!(
        !std::sync::Arc::ptr_eq(&before[1], &after[1]),
        "y changed: a new one"
    );
    assert_eq!(routes(&mut source), ["x", "y"]);
}
