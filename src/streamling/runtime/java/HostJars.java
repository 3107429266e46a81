package streamling.spark;

import java.io.File;
import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.ReadableByteChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.FileTime;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;

import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Logger;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.apache.spark.util.MutableURLClassLoader;

/**
 * The connector jars of an application, kept once per worker host instead of once per executor.
 *
 * <p>Jars given to Spark through {@code spark.jars} are copied by every executor of every
 * application into its work folder before its first task: ~20 MB of connectors per executor each
 * time, and ~700 MB for {@code s3a://} (hadoop-aws and the AWS SDK bundle), which made S3 from a
 * remote worker impractical. With this plugin the driver serves the jars listed in
 * {@value #JARS} from its file server (each file alone, as {@code spark.jars} would), and each
 * executor, when it starts, makes sure every one is in its host's cache ({@code
 * $STREAMLING_WORKER_CACHE/jars}, default {@code ${TMPDIR:-/tmp}/streamling-envs/jars}, beside
 * the shipped Python environment), then adds them to the class loader Spark runs tasks with, which
 * is the one {@code spark.jars} would have added them to. An executor on a host that has the
 * driver's very file (the driver's host, a shared installation) uses it in place.
 *
 * <p>One executor per host fetches a jar, under a file lock; the others wait and find it whole. A
 * jar lands under its final name only once complete. A new fetch prunes each artifact to its
 * {@value #KEEP} most recently used versions, sparing any a live process has open.
 */
public final class HostJars implements SparkPlugin {
    /** the Spark setting listing the driver's local jars that executors take from their host's cache */
    public static final String JARS = "spark.streamling.hostJars";
    /** versions of each artifact a host keeps besides those in use */
    static final int KEEP = 3;

    private static final Logger LOG = LogManager.getLogger(HostJars.class);

    @Override
    public DriverPlugin driverPlugin() {
        return new Driver();
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new Executor();
    }

    /** Serves the listed jars and tells executors what they are; reports what executors could not do. */
    static final class Driver implements DriverPlugin {
        @Override
        public Map<String, String> init(SparkContext sc, PluginContext ctx) {
            Map<String, String> out = new HashMap<>();
            int n = 0;
            for (String entry : sc.conf().get(JARS, "").split(",")) {
                if (entry.isBlank()) {
                    continue;
                }
                File jar = new File(entry.trim()).getAbsoluteFile();
                if (!jar.isFile()) {
                    throw new IllegalArgumentException("streamling: the connector jar " + jar + " does not exist on "
                            + "the driver's host: check spark.jars");
                }
                out.put(n + ".uri", sc.env().rpcEnv().fileServer().addJar(jar));
                out.put(n + ".name", jar.getName());
                out.put(n + ".path", jar.getPath());
                out.put(n + ".size", Long.toString(jar.length()));
                out.put(n + ".mtime", Long.toString(jar.lastModified()));
                n++;
            }
            out.put("count", Integer.toString(n));
            return out;
        }

        /** hosts whose problem was said already: the master keeps relaunching executors there */
        private final Set<String> reported = java.util.concurrent.ConcurrentHashMap.newKeySet();

        @Override
        public Object receive(Object message) {
            String[] hostAndProblem = String.valueOf(message).split("\n", 2);
            if (hostAndProblem.length == 2 && reported.add(hostAndProblem[0])) {
                LOG.error(hostAndProblem[1]);
            }
            return Boolean.TRUE;
        }
    }

    /** Puts the application's jars in the host's cache, then on the tasks' class path. */
    static final class Executor implements ExecutorPlugin {
        @Override
        public void init(PluginContext ctx, Map<String, String> conf) {
            int count = Integer.parseInt(conf.getOrDefault("count", "0"));
            if (count == 0) {
                return;
            }
            Path cache = cacheDir();
            try {
                MutableURLClassLoader loader = taskLoader();
                boolean fetched = false;
                for (int i = 0; i < count; i++) {
                    Jar jar = new Jar(conf, i);
                    Path local = jar.onThisHost();
                    if (local == null) {
                        local = jar.inCache(cache);
                        fetched |= jar.fetched;
                    }
                    loader.addURL(local.toUri().toURL());
                }
                if (fetched) {
                    prune(cache, KEEP);
                }
            } catch (IOException | RuntimeException e) {
                String host = hostName();
                String problem = "streamling: worker host " + host + " (executor " + ctx.executorID()
                        + ") cannot put the application's connector jars in its cache " + cache + ": " + e
                        + ". Check that every worker reaches the driver (spark.driver.host) and has room in "
                        + cache + ", or point spark.executorEnv.STREAMLING_WORKER_CACHE elsewhere";
                try {
                    ctx.ask(host + "\n" + problem);  // said in the driver's log, once per host
                } catch (Exception unreachable) {
                    throw new IllegalStateException(problem, e);  // the executor's own log keeps it
                }
                // Spark names this executor's loss in the driver's log at each attempt: point there.
                throw new IllegalStateException("streamling: the connector jars are not in this host's cache (the "
                        + "driver's log says why, once per host)", e);
            }
        }
    }

    /** One jar as the driver described it. */
    static final class Jar {
        final String uri;
        final String name;
        final String driverPath;
        final long size;
        final long mtime;
        boolean fetched;

        Jar(Map<String, String> conf, int i) {
            uri = conf.get(i + ".uri");
            name = conf.get(i + ".name");
            driverPath = conf.get(i + ".path");
            size = Long.parseLong(conf.get(i + ".size"));
            mtime = Long.parseLong(conf.get(i + ".mtime"));
        }

        /** The driver's own file when this host has it (same size and time), else null. */
        Path onThisHost() {
            File own = new File(driverPath);
            return own.isFile() && own.length() == size && own.lastModified() == mtime ? own.toPath() : null;
        }

        /** Its folder in a host cache: the artifact's name, then a digest of what identifies the file. */
        String key() {
            String id = name + "\n" + size + "\n" + mtime;
            try {
                byte[] digest = MessageDigest.getInstance("SHA-256").digest(id.getBytes(StandardCharsets.UTF_8));
                return artifact(name) + "@" + HexFormat.of().formatHex(digest, 0, 8);
            } catch (NoSuchAlgorithmException e) {
                throw new IllegalStateException(e);
            }
        }

        /** The jar in ``cache``, fetched from the driver first unless it is there whole already. */
        Path inCache(Path cache) throws IOException {
            Files.createDirectories(cache);
            String key = key();
            Path folder = cache.resolve(key);
            Path jar = folder.resolve(name);
            Path complete = folder.resolve(".complete");
            try (FileChannel lockFile = FileChannel.open(cache.resolve(key + ".lock"), StandardOpenOption.CREATE,
                    StandardOpenOption.WRITE); FileLock lock = lockFile.lock()) {
                if (Files.isRegularFile(complete)) {
                    Files.setLastModifiedTime(complete, FileTime.fromMillis(System.currentTimeMillis()));  // used now: the most recent of its artifact, kept
                    return jar;
                }
                // One name per jar, not per process: under the lock only one process works on it, and
                // what a process killed half-way left is cleared by the next one.
                Path partial = cache.resolve(key + ".partial");
                deleteTree(folder);
                deleteTree(partial);
                Files.createDirectories(partial);
                long got;
                try (ReadableByteChannel in = SparkEnv.get().rpcEnv().openChannel(uri);
                     FileChannel out = FileChannel.open(partial.resolve(name), StandardOpenOption.CREATE_NEW,
                             StandardOpenOption.WRITE)) {
                    got = 0;
                    long n;
                    while ((n = out.transferFrom(in, got, 64L << 20)) > 0) {
                        got += n;
                    }
                }
                if (got != size) {
                    deleteTree(partial);
                    throw new IOException("the driver sent " + got + " of " + size + " bytes of " + name);
                }
                Files.createFile(partial.resolve(".complete"));
                try {
                    Files.move(partial, folder, StandardCopyOption.ATOMIC_MOVE);
                } catch (AtomicMoveNotSupportedException e) {
                    Files.move(partial, folder);
                }
                fetched = true;
                return jar;
            }
        }
    }

    /** The host's cache of jars: where the shipped Python environment's launcher keeps its parts, plus /jars. */
    static Path cacheDir() {
        String base = System.getenv("STREAMLING_WORKER_CACHE");
        if (base == null || base.isEmpty()) {
            String tmp = System.getenv("TMPDIR");
            base = (tmp == null || tmp.isEmpty() ? "/tmp" : tmp) + "/streamling-envs";
        }
        return Path.of(base, "jars");
    }

    /** This host's name (an executor's RPC environment has no address of its own to take it from). */
    static String hostName() {
        try {
            return java.net.InetAddress.getLocalHost().getHostName();
        } catch (IOException e) {
            return "?";
        }
    }

    /** ``hadoop-aws-3.5.0.jar`` → ``hadoop-aws``: what versions of one artifact share. */
    static String artifact(String jarName) {
        String stem = jarName.endsWith(".jar") ? jarName.substring(0, jarName.length() - 4) : jarName;
        return stem.replaceFirst("[-_]\\d[^/]*$", "");
    }

    /** The class loader Spark adds {@code spark.jars} to, which loads the classes of every task. */
    static MutableURLClassLoader taskLoader() {
        for (ClassLoader l = Thread.currentThread().getContextClassLoader(); l != null; l = l.getParent()) {
            if (l instanceof MutableURLClassLoader) {
                return (MutableURLClassLoader) l;
            }
        }
        throw new IllegalStateException("the executor's task class loader is not a MutableURLClassLoader");
    }

    /**
     * Removes each artifact's versions beyond the ``keep`` most recently used that no live process has
     * open; returns the folders removed. Best effort: one it cannot lock or remove stays.
     */
    static List<String> prune(Path cache, int keep) {
        Map<String, List<Path>> byArtifact = new HashMap<>();
        try (Stream<Path> entries = Files.list(cache)) {
            entries.filter(p -> Files.isRegularFile(p.resolve(".complete")) && p.getFileName().toString().contains("@"))
                    .forEach(p -> byArtifact.computeIfAbsent(p.getFileName().toString().split("@")[0],
                            k -> new ArrayList<>()).add(p));
        } catch (IOException e) {
            return List.of();
        }
        Set<String> open = openFiles();
        List<String> removed = new ArrayList<>();
        for (List<Path> versions : byArtifact.values()) {
            versions.sort(Comparator.comparingLong(HostJars::lastUsed).reversed());
            for (Path folder : versions.subList(Math.min(keep, versions.size()), versions.size())) {
                String prefix = folder.toAbsolutePath() + File.separator;
                if (open.stream().anyMatch(f -> f.startsWith(prefix))) {
                    continue;
                }
                Path lockPath = folder.resolveSibling(folder.getFileName() + ".lock");
                try (FileChannel lockFile = FileChannel.open(lockPath, StandardOpenOption.CREATE,
                        StandardOpenOption.WRITE); FileLock lock = lockFile.tryLock()) {
                    if (lock == null) {
                        continue;  // an executor fetching it now: leave it
                    }
                    Files.delete(folder.resolve(".complete"));  // no executor trusts it from here on
                    deleteTree(folder);
                    removed.add(folder.getFileName().toString());
                } catch (IOException e) {
                    continue;
                }
                try {
                    Files.deleteIfExists(lockPath);
                } catch (IOException ignored) {
                    // a later prune removes it
                }
            }
        }
        return removed;
    }

    private static long lastUsed(Path folder) {
        try {
            return Files.getLastModifiedTime(folder.resolve(".complete")).toMillis();
        } catch (IOException e) {
            return 0L;
        }
    }

    /** Every file a live process of this user has open (Linux's /proc; none elsewhere). */
    private static Set<String> openFiles() {
        Set<String> open = new HashSet<>();
        File[] procs = new File("/proc").listFiles((d, n) -> n.chars().allMatch(Character::isDigit));
        for (File proc : procs == null ? new File[0] : procs) {
            File[] fds = new File(proc, "fd").listFiles();
            for (File fd : fds == null ? new File[0] : fds) {
                try {
                    open.add(Files.readSymbolicLink(fd.toPath()).toString());
                } catch (IOException | UnsupportedOperationException e) {
                    // gone, or not ours to read
                }
            }
        }
        return open;
    }

    private static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) {
            return;
        }
        try (Stream<Path> walk = Files.walk(root)) {
            for (Path p : walk.sorted(Comparator.reverseOrder()).toList()) {
                Files.deleteIfExists(p);
            }
        }
    }

    /** A tool for tests and operators: {@code java … streamling.spark.HostJars prune <cache> [keep]}. */
    public static void main(String[] args) {
        if (args.length >= 2 && args[0].equals("prune")) {
            int keep = args.length > 2 ? Integer.parseInt(args[2]) : KEEP;
            prune(Path.of(args[1]), keep).forEach(System.out::println);
            return;
        }
        System.err.println("usage: HostJars prune <cache folder> [keep]");
        System.exit(2);
    }
}
