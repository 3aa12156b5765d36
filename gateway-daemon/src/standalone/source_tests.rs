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

/// The routes in force, by name, sorted.
fn routes(source: &mut ManifestSource) -> Vec<String> {
    let (snapshot, layout) = source.take_snapshot();
    let mut names: Vec<String> = snapshot
        .routes
        .iter()
        .map(|r| r.metadata.name.to_string())
        .collect();
    source.give_back(snapshot, layout);
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
