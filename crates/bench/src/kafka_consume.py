"""The Kafka consumer a user would run instead of Sluice's source: librdkafka (the
confluent-kafka package) assigned every partition of a topic from its start, reading
until it has the expected number of messages. Values are counted, not parsed.

Usage: kafka_consume.py BROKERS TOPIC EXPECTED
Prints one JSON object: {"messages", "bytes", "secs"} (secs from assign to the last).
"""

import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

brokers, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
consumer = Consumer(
    {
        "bootstrap.servers": brokers,
        "group.id": f"sluice-bench-{time.time_ns()}",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 10,
    }
)
partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
start = time.monotonic()
consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
messages = size = 0
deadline = start + 600
while messages < expected:
    if time.monotonic() > deadline:
        sys.exit(f"read {messages} of {expected} messages in 600 s")
    for message in consumer.consume(num_messages=10000, timeout=1.0):
        if message.error():
            sys.exit(f"consuming {topic}: {message.error()}")
        size += len(message.value())
        messages += 1
secs = time.monotonic() - start
consumer.close()
print(json.dumps({"messages": messages, "bytes": size, "secs": secs}))
