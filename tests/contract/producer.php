<?php
// A PHP producer that follows docs/sql-contract.md to the letter.
//
// Usage: php producer.php DB
//
// Writes, each in its own transaction, a business row (table `orders`, made
// by the test) together with an event:
//
//   1. a full event: every optional column filled;
//   2. a minimal event: event_id, event_type and payload only;
//   3. a legacy event: no event_id at all;
//   4. the full event's idempotency key again: ON CONFLICT DO NOTHING writes
//      nothing, and the existing event id is looked up;
//   5. a business row and an event in a transaction that is rolled back.
//
// Prints one JSON object describing what it wrote, for tests/hosts/sql_contract.rs.
// Needs only php-cli and php-sqlite3 (PDO's SQLite driver).

declare(strict_types=1);

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

// "now" in INTEGER milliseconds since the Unix epoch, computed by SQLite.
const NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/** Milliseconds since the Unix epoch. */
function now_ms(): int
{
    return (int) floor(microtime(true) * 1000);
}

/** A ULID: 48-bit millisecond timestamp + 80 random bits, Crockford base32. */
function new_ulid(): string
{
    // 6 bytes of timestamp (big-endian) + 10 random bytes = 128 bits.
    $bytes = substr(pack('J', now_ms()), 2) . random_bytes(10);
    // 26 characters of 5 bits = 130 bits: two leading zero bits, then the 128.
    $bits = '00';
    foreach (str_split($bytes) as $byte) {
        $bits .= str_pad(decbin(ord($byte)), 8, '0', STR_PAD_LEFT);
    }
    $ulid = '';
    foreach (str_split($bits, 5) as $chunk) {
        $ulid .= CROCKFORD[bindec($chunk)];
    }
    return $ulid;
}

function connect(string $path): PDO
{
    if (!extension_loaded('pdo_sqlite')) {
        fwrite(STDERR, "PDO's SQLite driver is missing: apt-get install php-sqlite3\n");
        exit(3);
    }
    $db = new PDO('sqlite:' . $path, null, null, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
    $db->exec('PRAGMA busy_timeout = 5000');
    $mode = $db->query('PRAGMA journal_mode = WAL')->fetchColumn();
    if (strtolower((string) $mode) !== 'wal') {
        fwrite(STDERR, "journal_mode is $mode, not wal\n");
        exit(1);
    }
    $db->exec('PRAGMA synchronous = FULL');
    return $db;
}

/** Runs $work($db) inside a transaction, rolling back on any exception. */
function transaction(PDO $db, callable $work)
{
    $db->beginTransaction();
    try {
        $result = $work($db);
        $db->commit();
        return $result;
    } catch (Throwable $e) {
        $db->rollBack();
        throw $e;
    }
}

function fail(string $message): void
{
    fwrite(STDERR, $message . "\n");
    exit(1);
}

const INSERT_FULL = "
INSERT INTO event_outbox (event_id, event_type, event_version, payload,
                          tenant_id, idempotency_key, ordering_key,
                          causation_id, correlation_id, occurred_at, available_at)
VALUES (:event_id, :event_type, :event_version, :payload,
        :tenant_id, :idempotency_key, :ordering_key,
        :causation_id, :correlation_id, :occurred_at, " . NOW_MS . ")
ON CONFLICT DO NOTHING";

if ($argc !== 2) {
    fail('usage: php producer.php DB');
}
$db = connect($argv[1]);
$report = ['sqlite_version' => $db->query('SELECT sqlite_version()')->fetchColumn()];

// 1. Every optional column filled.
$full = [
    'event_id' => new_ulid(),
    'event_type' => 'order.placed.v1',
    'tenant_id' => 'shop-7',
    'idempotency_key' => 'order-php-1-placed',
    'ordering_key' => 'order-php-1',
    'causation_id' => 'cmd-php-1',
    'correlation_id' => 'req-php-1',
    'occurred_at' => now_ms(),
    'payload' => ['order' => 'php-1', 'total_cents' => 1250, 'note' => "caf\u{e9} \u{2615}"],
];
transaction($db, function (PDO $db) use ($full) {
    $db->prepare('INSERT INTO orders (ref, total_cents) VALUES (?, ?)')->execute(['php-1', 1250]);
    $stmt = $db->prepare(INSERT_FULL);
    $stmt->bindValue(':event_id', $full['event_id']);
    $stmt->bindValue(':event_type', $full['event_type']);
    $stmt->bindValue(':event_version', 1, PDO::PARAM_INT);
    $stmt->bindValue(':payload', json_encode($full['payload'], JSON_THROW_ON_ERROR | JSON_UNESCAPED_UNICODE));
    $stmt->bindValue(':tenant_id', $full['tenant_id']);
    $stmt->bindValue(':idempotency_key', $full['idempotency_key']);
    $stmt->bindValue(':ordering_key', $full['ordering_key']);
    $stmt->bindValue(':causation_id', $full['causation_id']);
    $stmt->bindValue(':correlation_id', $full['correlation_id']);
    $stmt->bindValue(':occurred_at', $full['occurred_at'], PDO::PARAM_INT);
    $stmt->execute();
    if ($stmt->rowCount() !== 1) {
        fail('the full event was not inserted (rowCount ' . $stmt->rowCount() . ')');
    }
});
$report['full'] = $full;

// 2. The minimum a well-behaved producer writes.
$minimal = ['event_id' => new_ulid(), 'event_type' => 'order.placed.v1', 'payload' => ['order' => 'php-2']];
transaction($db, function (PDO $db) use ($minimal) {
    $db->prepare('INSERT INTO orders (ref, total_cents) VALUES (?, ?)')->execute(['php-2', 300]);
    $db->prepare('INSERT INTO event_outbox (event_id, event_type, payload) VALUES (?, ?, ?)')
        ->execute([$minimal['event_id'], $minimal['event_type'], json_encode($minimal['payload'], JSON_THROW_ON_ERROR)]);
});
$report['minimal'] = $minimal;

// 3. A legacy producer: no event id.
$report['legacy_row_id'] = transaction($db, function (PDO $db) {
    $db->prepare('INSERT INTO orders (ref, total_cents) VALUES (?, ?)')->execute(['php-3', 700]);
    $db->prepare('INSERT INTO event_outbox (event_type, payload) VALUES (?, ?)')
        ->execute(['order.placed.v1', json_encode(['order' => 'php-3'], JSON_THROW_ON_ERROR)]);
    return (int) $db->lastInsertId();
});

// 4. The same (tenant, key) again: nothing is written; find the first event.
$report['duplicate_of'] = transaction($db, function (PDO $db) use ($full) {
    $stmt = $db->prepare(INSERT_FULL);
    $stmt->execute([
        ':event_id' => new_ulid(),
        ':event_type' => 'order.placed.v1',
        ':event_version' => 1,
        ':payload' => json_encode(['order' => 'php-1', 'retry' => true], JSON_THROW_ON_ERROR),
        ':tenant_id' => $full['tenant_id'],
        ':idempotency_key' => $full['idempotency_key'],
        ':ordering_key' => null,
        ':causation_id' => null,
        ':correlation_id' => null,
        ':occurred_at' => now_ms(),
    ]);
    if ($stmt->rowCount() !== 0) {
        fail('the duplicate was inserted (rowCount ' . $stmt->rowCount() . ')');
    }
    $find = $db->prepare('SELECT event_id FROM event_outbox WHERE tenant_id = ? AND idempotency_key = ?');
    $find->execute([$full['tenant_id'], $full['idempotency_key']]);
    return $find->fetchColumn();
});

// 5. A transaction that fails after writing both rows leaves neither.
$rolledBack = new_ulid();
try {
    transaction($db, function (PDO $db) use ($rolledBack) {
        $db->prepare('INSERT INTO orders (ref, total_cents) VALUES (?, ?)')->execute(['php-rollback', 1]);
        $db->prepare('INSERT INTO event_outbox (event_id, event_type, payload) VALUES (?, ?, ?)')
            ->execute([$rolledBack, 'order.placed.v1', json_encode(['order' => 'php-rollback'], JSON_THROW_ON_ERROR)]);
        throw new RuntimeException('payment declined');
    });
    fail('the failing transaction did not fail');
} catch (RuntimeException $e) {
    // Expected: the transaction was rolled back.
}
$report['rolled_back_event_id'] = $rolledBack;
$report['rolled_back_order'] = 'php-rollback';
$report['orders'] = ['php-1', 'php-2', 'php-3'];

echo json_encode($report, JSON_THROW_ON_ERROR | JSON_UNESCAPED_UNICODE), "\n";
