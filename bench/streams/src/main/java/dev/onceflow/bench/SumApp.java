package dev.onceflow.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * Contender d of the onceflow benchmark: decode each JSON event, add its amount to a
 * per-key sum kept in a state store (the default persistent store, with its changelog),
 * emit one JSON output per input carrying the input's send time. exactly_once_v2.
 *
 * <p>Arguments: {@code --brokers B --input T --output T --application-id A
 * --commit-interval-ms N --state-dir D}.
 */
public final class SumApp {
  private static final String STORE = "sums";
  private static final ObjectMapper JSON = new ObjectMapper();

  public static void main(String[] args) throws Exception {
    Map<String, String> opts = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      opts.put(args[i].replaceFirst("^--", ""), args[i + 1]);
    }
    String input = require(opts, "input");
    String output = require(opts, "output");

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, require(opts, "application-id"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, require(opts, "brokers"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, opts.getOrDefault("commit-interval-ms", "100"));
    props.put(StreamsConfig.STATE_DIR_CONFIG, require(opts, "state-dir"));
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(opts.getOrDefault("threads", "1")));
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

    StreamsBuilder builder = new StreamsBuilder();
    builder.addStateStore(Stores.keyValueStoreBuilder(
        Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long()));
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .process(Sum::new, STORE)
        .to(output, Produced.with(Serdes.String(), Serdes.ByteArray()));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      streams.close();
      stopped.countDown();
    }));
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();
      return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
          .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
    });
    streams.start();
    stopped.await();
  }

  private static String require(Map<String, String> opts, String name) {
    String value = opts.get(name);
    if (value == null) {
      throw new IllegalArgumentException("missing --" + name);
    }
    return value;
  }

  /** The per-event work, the same as the Rust contenders'. */
  static final class Sum implements Processor<String, byte[], String, byte[]> {
    private ProcessorContext<String, byte[]> context;
    private KeyValueStore<String, Long> sums;

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
      this.sums = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<String, byte[]> record) {
      try {
        JsonNode event = JSON.readTree(record.value());
        String key = event.get("key").asText();
        Long previous = sums.get(key);
        long sum = (previous == null ? 0 : previous) + event.get("amount").asLong();
        sums.put(key, sum);
        ObjectNode out = JSON.createObjectNode();
        out.put("id", event.get("id").asText());
        out.put("key", key);
        out.put("sum", sum);
        out.put("sent_us", event.get("sent_us").asLong());
        java.time.Instant now = java.time.Instant.now();
        out.put("processed_us", now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000);
        context.forward(record.withValue(JSON.writeValueAsBytes(out)));
      } catch (java.io.IOException e) {
        throw new RuntimeException("undecodable event", e);
      }
    }
  }
}
