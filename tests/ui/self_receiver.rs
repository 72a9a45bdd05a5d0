struct Billing;

impl Billing {
    #[ferriq::task(name = "ui.self")]
    async fn invoice(&self, id: u64) -> u64 {
        id
    }
}

fn main() {}
