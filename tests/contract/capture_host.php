<?php
// A PHP host that knows nothing of outboxd, writing with PDO (php-sqlite3,
// the system's SQLite): one transaction it rolls back, one it commits. The
// capture triggers must leave no event for the first and one for the
// second. Used by tests/hosts/capture_hosts.rs.
//
//     php capture_host.php DB
//
// Prints a JSON report on stdout.

$db = new PDO('sqlite:' . $argv[1], null, null, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
$db->exec('PRAGMA busy_timeout = 5000');
$db->exec('PRAGMA synchronous = FULL');

$insert = $db->prepare('INSERT INTO pages (slug, title, body) VALUES (?, ?, ?)');

$db->beginTransaction();
$insert->execute(['draft', 'Never published', 'rolled back']);
$db->rollBack();

$db->beginTransaction();
$insert->execute(['hello', 'Hello from PHP', "Grüße, \"quoted\"\nand a new line"]);
$db->commit();

echo json_encode([
    'sqlite_version' => $db->query('SELECT sqlite_version()')->fetchColumn(),
    'pages' => (int) $db->query('SELECT count(*) FROM pages')->fetchColumn(),
]), "\n";
