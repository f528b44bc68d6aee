# gpu_ivfpq_check against corrupt indexes: each test writes a copy of a
# sound index's file with one corruption (the server stopped), restarts,
# and expects gpu_ivfpq_check to name the block and the broken invariant,
# and an index scan to end in an ERROR (or, where a reader cannot notice
# cheaply, in rows) without crashing the server. The byte edits are plain
# Perl on the relation file, using the layout of src/am/am.h. Finally the
# checker runs beside inserts, updates, deletes and VACUUM, and must raise
# no false alarm.
use strict;
use warnings;

use Fcntl qw(O_RDONLY O_WRONLY O_TRUNC SEEK_SET);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $BLCKSZ = 8192;
my $HEADER = 24;          # page header, PageGetContents = MAXALIGN(24)
my $SPECIAL = 8184;       # pd_special: the 8-byte page opaque at the end
my $PAGE_ID = 0xFF8A;
my $M = 4;                # the index's m: an entry is a 6-byte TID + m bytes
                          # (store_vectors = off: pages hold only these entries)
my $ESZ = 6 + $M;

my $node = PostgreSQL::Test::Cluster->new('check');
# The test damages pages for the extension's checker to find: where initdb
# turns data checksums on (from PostgreSQL 18), the server's own checksum
# check would refuse those pages first (invalid page, XX001).
$node->init(extra => ($node->pg_version >= 18 ? ['--no-data-checksums'] : []));
$node->start;

# 3000 rows in 2 lists of about 1500 entries: two pages per list (816
# entries of 10 bytes fit on a page).
$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE items (id int, v real[]) WITH (autovacuum_enabled = off);
	SELECT setseed(0.5);
	INSERT INTO items
	SELECT i, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 8) WHERE i > 0)
	FROM generate_series(1, 3000) i;
	CREATE INDEX items_idx ON items USING gpu_ivfpq (v) WITH (lists = 2, m = 4, store_vectors = off);
	CHECKPOINT;
});
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_check('items_idx', true)}),
	'', 'the sound index passes');

my $pgdata = $node->data_dir;
my $file = $pgdata . '/' . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('items_idx')});
my $heap_blocks = $node->safe_psql('postgres', q{SELECT pg_relation_size('items') / 8192});
$node->stop;

# ---- the relation file, read and written in pages
sub read_file_bytes
{
	my ($path) = @_;
	sysopen(my $fh, $path, O_RDONLY) or die "open $path: $!";
	my $size = -s $fh;
	sysread($fh, my $bytes, $size) == $size or die "read $path: $!";
	close $fh;
	return $bytes;
}

sub write_file_bytes
{
	my ($path, $bytes) = @_;
	sysopen(my $fh, $path, O_WRONLY | O_TRUNC) or die "open $path: $!";
	syswrite($fh, $bytes) == length($bytes) or die "write $path: $!";
	close $fh;
}

# Overwrites bytes at block $blk, offset $off of the file.
sub poke
{
	my ($blk, $off, $bytes) = @_;
	sysopen(my $fh, $file, O_WRONLY) or die "open $file: $!";
	sysseek($fh, $blk * $BLCKSZ + $off, SEEK_SET) or die "seek $file: $!";
	syswrite($fh, $bytes) == length($bytes) or die "write $file: $!";
	close $fh;
}

my $original = read_file_bytes($file);
my $nblocks = length($original) / $BLCKSZ;
sub page { return substr($original, $_[0] * $BLCKSZ, $BLCKSZ); }
sub u16 { return unpack('v', substr($_[0], $_[1], 2)); }
sub u32 { return unpack('V', substr($_[0], $_[1], 4)); }

# The metapage (block 0): GpuIvfpqMetaPageData at PageGetContents.
my $meta = page(0);
is(u32($meta, $HEADER), 0x49565051, 'metapage magic where am.h puts it');
my $lists = u32($meta, $HEADER + 12);
my $listdir = u32($meta, $HEADER + 36);
is($lists, 2, 'two lists');
is(u16($meta, $HEADER + 16), $M, "m = $M");

# Each list's chain, from the directory's heads through the pages' next.
my @chain;
for my $l (0 .. $lists - 1)
{
	my $blk = u32(page($listdir), $HEADER + 16 * $l);
	while ($blk != 0xFFFFFFFF)
	{
		push @{ $chain[$l] }, $blk;
		$blk = u32(page($blk), $SPECIAL);
	}
	ok(@{ $chain[$l] } >= 2, "list $l has a chain of several pages");
}
my ($a0, $a1) = @{ $chain[0] };
my ($b0) = @{ $chain[1] };
my $pd_lower_b0 = u16(page($b0), 12);

# An entry's TID: BlockIdData (bi_hi, bi_lo) then the offset, 16 bits each.
sub tid_bytes
{
	my ($blk, $off) = @_;
	return pack('vvv', $blk >> 16, $blk & 0xFFFF, $off);
}
my $tid_a0 = substr(page($a0), $HEADER, 6);

# The scan: every list probed and every entry re-ranked, so that every page
# and TID is read.
my $scan = q{SET enable_seqscan = off; SET gpu_ivfpq.probes = 2; SET gpu_ivfpq.rerank = 10000;
	SELECT id FROM items ORDER BY v <-> '{0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8}' LIMIT 5;};

# Runs one corruption: restores the original file, applies $corrupt, starts
# the server and compares what the checker and a scan report. (The table
# keeps what VACUUM did to it: only rolled-back rows, never in the original.)
sub corruption
{
	my (%t) = @_;
	write_file_bytes($file, $original);
	$t{corrupt}->();
	$node->start;

	# VERBOSITY verbose: the SQLSTATE too.
	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSELECT gpu_ivfpq_check('items_idx', $t{heapallindexed});");
	isnt($ret, 0, "$t{name}: the checker fails");
	like($err, qr/ERROR:  $t{code}: /, "$t{name}: with SQLSTATE $t{code}");
	like($err, $t{check}, "$t{name}: the checker says why");

	($ret, $out, $err) = $node->psql('postgres', $scan);
	if ($t{scan})
	{
		isnt($ret, 0, "$t{name}: the index scan fails");
		like($err, $t{scan}, "$t{name}: the index scan says why");
	}
	else
	{
		my @rows = split /\n/, $out;
		is($ret, 0, "$t{name}: the index scan returns rows ($t{scan_note})");
		is(scalar(@rows), 5, "$t{name}: five of them");
	}
	# Inserts and VACUUM (removing the rolled-back rows, then a cleanup-only
	# pass) read the same pages: an ERROR or success, never a crash or a hang.
	$node->psql('postgres', q{BEGIN;
		INSERT INTO items SELECT i, ARRAY[i, 0, 0, 0, 0, 0, 0, 1]::real[] FROM generate_series(1, 20) i;
		ROLLBACK;});
	$node->psql('postgres', 'VACUUM items');
	$node->psql('postgres', 'VACUUM items');
	is($node->safe_psql('postgres', 'SELECT 1'), '1', "$t{name}: the server is up");
	$node->stop;
}

corruption(
	name => 'metapage magic',
	heapallindexed => 'false',
	code => 'XX002',
	corrupt => sub { poke(0, $HEADER, pack('V', 0xDEADBEEF)); },
	check => qr/index "items_idx" block 0: metapage magic 0xDEADBEEF is not gpu_ivfpq's 0x49565051/,
	scan => qr/index "items_idx" block 0: metapage magic 0xDEADBEEF/);

corruption(
	name => 'list page id',
	heapallindexed => 'false',
	code => 'XX002',
	corrupt => sub { poke($b0, $SPECIAL + 6, pack('v', 0x1234)); },
	check => qr/index "items_idx" block $b0: page id 0x1234 is not gpu_ivfpq's 0xFF8A \(a list page belongs here\)/,
	scan => qr/index "items_idx" block $b0: page id 0x1234/);

# pd_lower past pd_upper: PostgreSQL's own page verification refuses the
# page as it reads it from disk, before gpu_ivfpq sees it.
corruption(
	name => 'pd_lower beyond the capacity',
	heapallindexed => 'false',
	code => 'XX001',
	corrupt => sub { poke($b0, 12, pack('v', 8190)); },
	check => qr/invalid page in block $b0 of relation/,
	scan => qr/invalid page in block $b0 of relation/);

# Within pd_upper a bad pd_lower can only cut an entry: gpu_ivfpq's check.
corruption(
	name => 'pd_lower inside an entry',
	heapallindexed => 'false',
	code => 'XX002',
	corrupt => sub { poke($b0, 12, pack('v', $pd_lower_b0 - 3)); },
	check => qr/index "items_idx" block $b0: list 1 page's pd_lower \d+ does not end a whole $ESZ-byte entry/,
	scan => qr/index "items_idx" block $b0: list page's pd_lower \d+ does not end a whole $ESZ-byte entry/);

my $past = $nblocks + 100;
corruption(
	name => 'next past the end',
	heapallindexed => 'false',
	code => 'XX002',
	corrupt => sub { poke($a0, $SPECIAL, pack('V', $past)); },
	check => qr/index "items_idx" block $a0: list 0 next page $past is past the end of the index \($nblocks blocks\)/,
	scan => qr/index "items_idx" block $a0: next page $past is past the end of the index/);

corruption(
	name => 'chain loop',
	heapallindexed => 'false',
	code => 'XX002',
	corrupt => sub { poke($a1, $SPECIAL, pack('V', $a0)); },
	check => qr/index "items_idx" block $a1: list 0 leads back to block $a0: the chain loops/,
	scan => qr/index "items_idx" block \d+: list chain goes on to block \d+ after more pages than the index has \(\d+ blocks\): it loops/);

# Readers cannot notice a TID in two lists cheaply; the scan returns each
# row once (the re-rank skips repeated TIDs).
corruption(
	name => 'TID in two lists',
	heapallindexed => 'false',
	code => 'XX002',
	corrupt => sub { poke($b0, $HEADER, $tid_a0); },
	check => qr/index "items_idx" block $b0: list 1 holds heap TID \(\d+,\d+\), which list 0 also holds at block $a0/,
	scan_note => 'no reader looks for repeats');

my $bad_heap = $heap_blocks + 1000;
corruption(
	name => 'TID past the end of the table',
	heapallindexed => 'false',
	code => 'XX002',
	corrupt => sub { poke($b0, $HEADER + 5 * $ESZ, tid_bytes($bad_heap, 1)); },
	check => qr/index "items_idx" block $b0: list 1 entry 5 has heap TID \($bad_heap,1\), past the end of table "items" \(\d+ blocks\)/,
	# From 17 the message names a range: "could not read blocks N..N".
	scan => qr/could not read blocks? $bad_heap/);

# One entry less on a page: every structure is sound, only heapallindexed
# finds the row that the index lost.
corruption(
	name => 'an entry lost',
	heapallindexed => 'true',
	code => 'XX002',
	corrupt => sub { poke($b0, 12, pack('v', $pd_lower_b0 - $ESZ)); },
	check => qr/index "items_idx" has no entry for row \(\d+,\d+\) of table "items"/,
	scan_note => 'the lost row is not a candidate');

# The original file again: sound.
write_file_bytes($file, $original);
$node->start;
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_check('items_idx', true)}),
	'', 'the restored index passes');

# An index with vector copies (store_vectors, the default): with
# heapallindexed the checker compares each entry's copy with the row's
# vector, bit for bit. Entry 0 of a list page keeps its vector at the start
# of the page's vector region (PageGetContents + capacity * (6 + m) rounded
# as am.h's GpuIvfpqLayout does: content - capacity * 4 * dims).
$node->safe_psql('postgres', q{CREATE INDEX vec_idx ON items USING gpu_ivfpq (v) WITH (lists = 2, m = 4); CHECKPOINT;});
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_check('vec_idx', true)}), '', 'the index with vector copies passes');
my $vfile = $pgdata . '/' . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('vec_idx')});
$node->stop;
my $voriginal = read_file_bytes($vfile);
my $vmeta = substr($voriginal, 0, $BLCKSZ);
my $vdir = u32($vmeta, $HEADER + 36);
my $vhead = u32(substr($voriginal, $vdir * $BLCKSZ, $BLCKSZ), $HEADER);
my $content = $SPECIAL - $HEADER;
my $capacity = int($content / (6 + $M + 4 * 8));
my $vec0 = $HEADER + $content - $capacity * 4 * 8;
my $vcopy = $voriginal;
substr($vcopy, $vhead * $BLCKSZ + $vec0, 4) = pack('f<', 12345.5);
write_file_bytes($vfile, $vcopy);
$node->start;
my ($vret, $vout, $verr) = $node->psql('postgres', q{SELECT gpu_ivfpq_check('vec_idx', true)});
isnt($vret, 0, 'a damaged vector copy: the checker fails');
like($verr, qr/index "vec_idx" block $vhead: list \d+ entry 0 keeps a vector that is not the one of row \(\d+,\d+\)/,
	'a damaged vector copy: the checker says which entry');
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_check('vec_idx', false)}), '',
	'without heapallindexed the pages alone look sound');
$node->stop;
write_file_bytes($vfile, $voriginal);
$node->start;
$node->safe_psql('postgres', q{DROP INDEX vec_idx});

# An index with a filter column: each entry ends with the column's value
# (8 bytes after the TID and the code); with heapallindexed the checker
# compares it with the row's.
$node->safe_psql('postgres',
	q{CREATE INDEX key_idx ON items USING gpu_ivfpq (v, id) WITH (lists = 2, m = 4, store_vectors = off); CHECKPOINT;});
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_check('key_idx', true)}), '', 'the index with filter keys passes');
my $kfile = $pgdata . '/' . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('key_idx')});
$node->stop;
my $koriginal = read_file_bytes($kfile);
my $kdir = u32(substr($koriginal, 0, $BLCKSZ), $HEADER + 36);
my $khead = u32(substr($koriginal, $kdir * $BLCKSZ, $BLCKSZ), $HEADER);
my $kcopy = $koriginal;
substr($kcopy, $khead * $BLCKSZ + $HEADER + 6 + $M, 8) = pack('q<', 987654321);
write_file_bytes($kfile, $kcopy);
$node->start;
my ($kret, $kout, $kerr) = $node->psql('postgres', q{SELECT gpu_ivfpq_check('key_idx', true)});
isnt($kret, 0, 'a damaged filter key: the checker fails');
like($kerr, qr/index "key_idx" block $khead: list \d+ entry 0 keeps filter key 987654321, not the filter column of row \(\d+,\d+\)/,
	'a damaged filter key: the checker says which entry');
$node->stop;
write_file_bytes($kfile, $koriginal);
$node->start;
$node->safe_psql('postgres', q{DROP INDEX key_idx});

# An index with RaBitQ codes (codes = rabitq, bits = 2): an entry is the TID,
# two bit planes of one 32-bit word each (8 dimensions: bits 8..31 are
# padding, always 0), then three float4 factors (add, rescale, error). The
# checker reports a padding bit set and a factor no encoding writes; scans
# of the damaged index still return rows (a NaN estimate ranks last).
$node->safe_psql('postgres',
	q{DROP INDEX items_idx; CREATE INDEX rq_idx ON items USING gpu_ivfpq (v) WITH (lists = 2, codes = rabitq, bits = 2); CHECKPOINT;});
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_check('rq_idx', true)}), '', 'the index with RaBitQ codes passes');
my $rfile = $pgdata . '/' . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('rq_idx')});
$node->stop;
my $roriginal = read_file_bytes($rfile);
is(u16(substr($roriginal, 0, $BLCKSZ), $HEADER + 16), 2 * 4 + 12, 'm counts the planes and factors');
my $rdir = u32(substr($roriginal, 0, $BLCKSZ), $HEADER + 36);
my $rhead = u32(substr($roriginal, $rdir * $BLCKSZ, $BLCKSZ), $HEADER);
for my $r (
	[ 'a padding bit', $HEADER + 6 + 4 + 3, pack('C', 0x80), qr/list \d+ entry 0 has a bit set past the dimensions in its code/ ],
	[ 'a NaN factor', $HEADER + 6 + 8, pack('V', 0x7FC00000), qr/list \d+ entry 0 has factors that no encoding writes/ ])
{
	my ($what, $at, $bytes, $says) = @$r;
	my $rcopy = $roriginal;
	substr($rcopy, $rhead * $BLCKSZ + $at, length($bytes)) = $bytes;
	write_file_bytes($rfile, $rcopy);
	$node->start;
	my ($rret, $rout, $rerr) = $node->psql('postgres', q{SELECT gpu_ivfpq_check('rq_idx', false)});
	isnt($rret, 0, "RaBitQ codes, $what: the checker fails");
	like($rerr, qr/index "rq_idx" block $rhead: .*$says/, "RaBitQ codes, $what: the checker says which entry");
	($rret, $rout, $rerr) = $node->psql('postgres', q{SET enable_seqscan = off; SET gpu_ivfpq.probes = 2;
		SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> '{0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8}' LIMIT 5) x;});
	is($rout, '5', "RaBitQ codes, $what: a scan still returns rows");
	$node->stop;
}
write_file_bytes($rfile, $roriginal);
$node->start;
$node->safe_psql('postgres', q{DROP INDEX rq_idx});

# No false alarms under load: pgbench clients insert, update, delete and
# VACUUM (which frees TIDs that inserts then reuse) while others run the
# checker with heapallindexed; any error fails pgbench.
my $vector = 'ARRAY(SELECT random()::real FROM generate_series(1, 8) WHERE g > 0)';
$node->safe_psql(
	'postgres', qq{
	CREATE TABLE busy (id bigserial, tag int DEFAULT 0, v real[]) WITH (fillfactor = 70);
	SELECT setseed(0.6);
	INSERT INTO busy (v) SELECT $vector FROM generate_series(1, 3000) g;
	CREATE INDEX busy_idx ON busy USING gpu_ivfpq (v) WITH (lists = 8, m = 4);
	CREATE INDEX busy_tag_idx ON busy USING gpu_ivfpq (v, tag) WITH (lists = 8, m = 4);
});
my $dir = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file("$dir/insert.sql",
	"INSERT INTO busy (v) SELECT $vector FROM generate_series(1, 5) g;\n");
PostgreSQL::Test::Utils::append_to_file(
	"$dir/change.sql", qq{
\\set d random(1, 6000)
UPDATE busy SET tag = tag + 1 WHERE id = :d;
\\set d random(1, 6000)
UPDATE busy SET v = $vector FROM generate_series(1, 1) g WHERE id = :d;
\\set d random(1, 6000)
DELETE FROM busy WHERE id = :d;
});
PostgreSQL::Test::Utils::append_to_file("$dir/vacuum.sql", "VACUUM busy;\n");
PostgreSQL::Test::Utils::append_to_file("$dir/check.sql",
	"SELECT gpu_ivfpq_check('busy_idx', true);\n");
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[
		'pgbench', '-n', '-c', '6', '-j', '3', '-T', '10',
		'-f', "$dir/insert.sql\@10",
		'-f', "$dir/change.sql\@10",
		'-f', "$dir/vacuum.sql\@1",
		'-f', "$dir/check.sql\@3",
		'-h', $node->host, '-p', $node->port, 'postgres'
	],
	'<', \undef, '>', \$out, '2>', \$err,
	IPC::Run::timeout(180));
ok($ok, 'pgbench with checkers ran without errors') or diag("$out\n$err");
like($out, qr/number of transactions actually processed: [1-9]/, 'pgbench processed transactions');
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_check('busy_idx', true)}),
	'', 'the index passes after the load');

unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no server process crashed');
$node->stop;

done_testing();
