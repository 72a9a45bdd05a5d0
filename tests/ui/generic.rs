#[ferriq::task(name = "ui.generic")]
async fn echo<T: serde::Serialize>(value: T) -> T {
    value
}

fn main() {}
