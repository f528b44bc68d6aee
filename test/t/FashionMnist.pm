# Fashion-MNIST (Debian package dataset-fashion-mnist) for the TAP tests:
# where it is, and its idx files as COPY text (id, label, real[784]),
# written by tools/fmnist_load, the project's one reader of the idx format
# (the test runner passes the tools' folder in GPU_IVFPQ_TOOLS_BIN).
package FashionMnist;

use strict;
use warnings;

our $datadir = '/usr/share/datasets/fashion-mnist';
our @files = qw(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
  t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz);

# The fmnist_load binary, or undef when the tools were not built.
sub loader
{
	my $bin = $ENV{GPU_IVFPQ_TOOLS_BIN};
	return (defined $bin && $bin ne '' && -x "$bin/fmnist_load") ? "$bin/fmnist_load" : undef;
}

# True when every file is readable and fmnist_load is there to read them.
sub available
{
	if (!loader())
	{
		# Said here, as the tests' skip message names only the data folder.
		print STDERR "# fmnist_load not found: GPU_IVFPQ_TOOLS_BIN is not set to the built tools\n";
		return 0;
	}
	return !grep { !-r "$datadir/$_" } @files;
}

# Converts one idx image file and its label file to COPY text: id, label,
# embedding. Returns the number of rows written.
sub idx_to_copy
{
	my ($images, $labels, $limit, $path) = @_;
	my $tool = loader() or die "fmnist_load not found (GPU_IVFPQ_TOOLS_BIN)";
	system($tool, '--images', "$datadir/$images", '--labels', "$datadir/$labels",
		'--limit', $limit, '--out', $path) == 0
	  or die "fmnist_load $images: exit status " . ($? >> 8);
	open my $in, '<', $path or die "$path: $!";
	my $n = 0;
	$n++ while <$in>;
	close $in;
	return $n;
}

1;
