"""Regenerate src/hangwatch/bench/prompts.jsonl, the bundled prompt set of ``hangwatch bench``.

    python benchmarks/make_prompts.py > src/hangwatch/bench/prompts.jsonl

Seeded and offline: 240 prompts from templates over a few dozen topics, 8 to about 75 words each, so that
with max_tokens up to 128 they fit a 512-token context even under a tiny byte-level tokenizer (the test
model's tokenizer spends about 4.3 tokens per English word). Requests of varied length, like a chat
workload, rather than one fixed shape.
"""

from __future__ import annotations

import json
import random

SEED = 20261129
COUNT = 240

TOPICS = [
    "a hash map",
    "the TCP handshake",
    "garbage collection",
    "a B-tree index",
    "photosynthesis",
    "the water cycle",
    "compound interest",
    "a sourdough starter",
    "plate tectonics",
    "the immune system",
    "a Kalman filter",
    "public-key cryptography",
    "the French Revolution",
    "a bicycle gearbox",
    "speculative decoding",
    "a KV cache",
    "tensor parallelism",
    "unit testing",
    "a load balancer",
    "the Doppler effect",
    "supply and demand",
    "a compiler's register allocator",
    "DNS resolution",
    "a heat pump",
    "the Krebs cycle",
    "container images",
    "binary search",
    "a mutex and a semaphore",
    "ocean tides",
    "a transformer's attention layer",
    "solar panels",
    "the Roman aqueducts",
    "a Bloom filter",
    "vaccines",
    "the printing press",
    "lossless compression",
    "a pipeline stall",
    "jet engines",
    "rainbows",
    "a database transaction",
]
AUDIENCES = [
    "a ten-year-old",
    "a new engineer",
    "a busy manager",
    "a physics student",
    "a curious grandparent",
]
FORMS = [
    "three bullet points",
    "one short paragraph",
    "a numbered list of steps",
    "a short dialogue",
    "two sentences",
]
VERBS = ["Explain", "Describe", "Summarise how", "Teach", "Outline"]
DETAILS = [
    "Mention one common misconception and correct it.",
    "Give one concrete example with numbers.",
    "End with a question that checks understanding.",
    "Avoid jargon, or define it the first time it appears.",
    "Compare it with something from everyday life.",
    "Say what goes wrong when it fails, and how someone would notice.",
]
PASSAGE = (
    "the server started loading weights while the scheduler waited for the first batch and the cache "
    "filled slowly because every request carried a long prompt about the history of rivers bridges and "
    "trade routes that connected small towns across the valley during a long and dry summer"
)
PASSAGE_WORDS = PASSAGE.split()


def prompt(rng: random.Random, kind: int) -> str:
    topic = rng.choice(TOPICS)
    if kind == 0:
        return f"What is {topic}?"
    if kind == 1:
        return f"{rng.choice(VERBS)} {topic} to {rng.choice(AUDIENCES)} in {rng.choice(FORMS)}."
    if kind == 2:
        extra = " ".join(rng.sample(DETAILS, 2))
        return f"{rng.choice(VERBS)} {topic} to {rng.choice(AUDIENCES)} in {rng.choice(FORMS)}. {extra}"
    if kind == 3:
        a, b = rng.sample(TOPICS, 2)
        return (
            f"Write a short comparison of {a} and {b}. For each, say what problem it solves, "
            f"what it costs, and when you would not use it. Keep it under {rng.choice([80, 120, 150])} words."
        )
    start = rng.randrange(0, len(PASSAGE_WORDS) - 30)
    passage = " ".join(PASSAGE_WORDS[start : start + rng.randint(20, 30)])
    return (
        f"Summarise the following notes in {rng.choice(FORMS)}, then suggest a title.\n\n"
        f"Notes: {passage.capitalize()}. {' '.join(rng.sample(DETAILS, 1))}"
    )


def main() -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    while len(seen) < COUNT:
        text = prompt(rng, rng.choices(range(5), weights=[1, 3, 3, 2, 2])[0])
        if text not in seen:
            seen.add(text)
            print(json.dumps({"prompt": text}, ensure_ascii=False))


if __name__ == "__main__":
    main()
